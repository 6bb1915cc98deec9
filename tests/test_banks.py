"""Chapter 1's bank figure (attnlab.book.banks): 32 consecutive halves are 16 words in 16 banks, two
lanes to a word, one wavefront, by the rule the CPU executor counts by."""
import matplotlib
import pytest

from attnlab.book import banks


def test_32_halves_span_16_banks_two_lanes_to_a_word():
    a = banks.column_major_halves(d=0, threads=128)
    assert len(a.distinct_words) == 16 and a.busy_banks == list(range(16))
    assert a.lanes_per_word == 2 and a.wavefronts == 1
    # every d starts 64 words further on: the same banks; warp 1's rows sit 16 words on: the other half
    assert all(banks.column_major_halves(d, 128).banks == a.banks for d in range(4))
    odd = banks.column_major_halves(0, 128, warp=1)
    assert odd.busy_banks == list(range(16, 32)) and odd.wavefronts == 1


def test_wavefronts_count_distinct_words_per_bank():
    assert banks.warp_access([4 * lane for lane in range(32)], 4).wavefronts == 1        # 32 words, 32 banks
    assert banks.warp_access([0] * 32, 4).wavefronts == 1                                # one word: broadcast
    assert banks.warp_access([256 * lane for lane in range(32)], 2).wavefronts == 32     # row-major q_s: one bank
    assert banks.warp_access([16 * lane for lane in range(32)], 16).wavefronts == 4      # 16 B a lane: 4 phases


def test_bank_figure_draws(tmp_path):
    fig = banks.bank_figure(banks.column_major_halves(), "t")
    path = tmp_path / "banks.png"
    fig.savefig(path)
    matplotlib.pyplot.close(fig)
    assert path.stat().st_size > 5000
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("16 of the 32 banks" in t and "1 wavefront" in t for t in texts)


def test_the_cpu_executor_counts_the_same_for_chapter_1():
    """The kernel's own shared-memory loads and stores, on the CPU executor: as many wavefronts as
    a conflict-free kernel needs."""
    from attnlab.book import page
    from attnlab.executor.build import ExecutorUnavailable
    from attnlab.shapes import Shape

    try:
        counts = page.bank_counts_cpu(["01_scalar"], Shape(1, 1, 64, 64))["01_scalar"]["ld/st"]
    except ExecutorUnavailable as exc:
        pytest.skip(str(exc))
    assert counts.requests > 0 and counts.wavefronts == counts.ideal
