"""attnlab.records.code: a function's digest covers its every SASS line and its resources."""
from attnlab.records.code import function_digests

LISTING = """
\tcode for sm_89
\t\tFunction : attn_fwd_a
\t.headerflags\t@"EF_CUDA_SM89 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM89)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;           /* 0x00000a0000017a02 */
                                                                     /* 0x000fe40000000f00 */
\t\tFunction : attn_fwd_b
        /*0000*/                   EXIT ;                           /* 0x000000000000794d */
                                                                     /* 0x000fea0003800000 */
"""
PTXAS = """ptxas info    : Compiling entry function 'attn_fwd_a' for 'sm_89'
ptxas info    : Function properties for attn_fwd_a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 0 bytes smem
ptxas info    : Compiling entry function 'attn_fwd_b' for 'sm_89'
ptxas info    : Function properties for attn_fwd_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 0 bytes smem
"""


def test_each_function_is_digested_apart():
    d = function_digests(LISTING, PTXAS)
    assert set(d) == {"attn_fwd_a", "attn_fwd_b"} and d["attn_fwd_a"] != d["attn_fwd_b"]


def test_a_changed_control_code_changes_only_its_function():
    d = function_digests(LISTING, PTXAS)
    # the second word of MOV: another stall count, the same instruction text
    e = function_digests(LISTING.replace("0x000fe40000000f00", "0x001fe40000000f00"), PTXAS)
    assert e["attn_fwd_a"] != d["attn_fwd_a"] and e["attn_fwd_b"] == d["attn_fwd_b"]


def test_changed_resources_change_the_digest():
    d = function_digests(LISTING, PTXAS)
    e = function_digests(LISTING, PTXAS.replace("Used 32 registers", "Used 40 registers"))
    assert e["attn_fwd_a"] != d["attn_fwd_a"] and e["attn_fwd_b"] == d["attn_fwd_b"]


# ---- judged on real builds ------------------------------------------------------------------------

import pytest  # noqa: E402

from attnlab.kernels import registry  # noqa: E402
from attnlab.records import code  # noqa: E402


def _files(rels):
    from attnlab.paths import repo_root

    return lambda rel: (repo_root() / rel).read_bytes() if rel in rels else None


def test_a_build_that_lacks_an_entry_the_record_ran_is_not_the_same_code():
    spec = registry.get("01_scalar", "sm_89")
    read = _files(set(code.source_files(spec)))
    assert code.changed_code(spec, "sm_89", read, read) is None
    why = code.changed_code(spec, "sm_89", read, read, entries={"attn_fwd_01_gone"})
    assert why and "attn_fwd_01_gone not in the build" in why


def test_a_changed_file_that_is_not_compiled_cannot_be_judged_by_the_binary():
    spec = registry.get("07_mma_split_ctas", "sm_90")
    rels = code.source_files(spec)
    runner = next(r for r in rels if r.endswith(".py"))
    now = _files(set(rels))
    then = lambda rel: b"# an older launcher\n" if rel == runner else now(rel)  # noqa: E731
    assert code.changed_code(spec, "sm_90", then, now) == f"{runner} is not compiled, so the binary cannot tell"


def test_what_cannot_be_built_or_listed_counts_as_changed(tmp_path, monkeypatch):
    """No nvcc, or a listing with no function in it: never "the same code"."""
    from attnlab.kernels import toolchain

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))  # nothing faked here reaches the shared cache
    code.code_of.cache_clear()
    spec = registry.get("01_scalar", "sm_89")
    read = _files(set(code.source_files(spec)))
    monkeypatch.setattr(code, "function_digests", lambda *a, **k: {})
    assert "listed no function" in code.changed_code(spec, "sm_89", read, read)
    code.code_of.cache_clear()

    def missing():
        raise toolchain.ToolMissing("no nvcc here")

    monkeypatch.setattr(toolchain, "nvcc_version", missing)
    assert "could not be compared (ToolMissing: no nvcc here)" in code.changed_code(spec, "sm_89", read, read)
    code.code_of.cache_clear()


def test_the_attributes_of_a_function_are_part_of_its_code():
    """Launch bounds live in .nv.info.<function>, not in its SASS."""
    elf = ".nv.info.attn_fwd_a\n\t<0x1>\n\tAttribute:\tEIATTR_MAX_THREADS\n\tFormat:\tEIFMT_SVAL\n\tValue:\t0x80 0x1 0x1 \n\n"
    d = code.function_digests(LISTING, PTXAS, elf)
    e = code.function_digests(LISTING, PTXAS, elf.replace("0x80 0x1", "0x100 0x1"))
    assert e["attn_fwd_a"] != d["attn_fwd_a"] and e["attn_fwd_b"] == d["attn_fwd_b"]


@pytest.mark.parametrize("cc,sms,fresh", [("9.0", 132, True), ("8.9", 58, False)])
def test_an_edit_is_judged_in_the_build_the_records_gpu_ran(results, scratch_repository, cc, sms, fresh):
    """Chapter 7's source takes its stages from -DATTN07_STAGES_D64 on sm_90 (three) and from its
    own default on sm_89 (two): an edit of the default changes the L4's code and not the H100's, so
    an sm_90 record stays fresh and an sm_89 record goes stale."""
    from synthetic import git, synthetic_record

    from attnlab.records.results import load_records, write_record

    write_record(synthetic_record(kernel="07_mma", cc=cc, sms=sms))
    source = scratch_repository / "kernels" / "07_mma_swizzle.cu"
    text = source.read_text()
    assert text.count("constexpr int STAGES_D64 = 2;") == 1
    source.write_text(text.replace("constexpr int STAGES_D64 = 2;", "constexpr int STAGES_D64 = 3;"))
    git(scratch_repository, "commit", "-q", "-am", "three stages by default", date="2020-01-03T00:00:00Z")
    [item] = load_records()[0]
    why = item.stale["07_mma"]
    if fresh:
        assert why == []
    else:
        assert len(why) == 1 and "its sm_89 code changed (attn_fwd_07_mma" in why[0]
