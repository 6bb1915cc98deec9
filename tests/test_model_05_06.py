"""CPU models of chapters 5 and 6, checked without a GPU.

1. The tile loop of kernels/05_wmma.cu and kernels/06_warp_specialized.cu in NumPy, with the
   kernels' rounding points: scores in fp32 (fp16 products are exact in fp32, WMMA accumulates
   in fp32), the online softmax in fp32 starting from m = -inf, P rounded to fp16 before P V,
   O accumulated in fp32, the row sum in two per-lane shares, the final multiply by 1 / l.
   Causal blocks stop at their diagonal tile; K/V rows past L are zeros and masked; rows past L
   are computed and dropped. The model must meet the pass rule against the fp64 reference.
2. The chapter-6 producer/consumer schedule, simulated warp by warp under many interleavings:
   every stage is filled before it is read and never refilled before every consumer released
   it; each phase of each named barrier gets exactly the kernel's thread count of arrivals,
   from one tile only; no phase is left open at exit; nothing deadlocks.
"""
import random
import re

import numpy as np
import pytest
import torch

from attnlab.pass_rule import judge, make_inputs
from attnlab.paths import kernels_dir
from attnlab.reference import naive_fp16, reference_attention
from attnlab.shapes import Shape

TILE_SRC = (kernels_dir() / "wmma_tile.cuh").read_text()
SRC05 = (kernels_dir() / "05_wmma.cu").read_text()
SRC06 = (kernels_dir() / "06_warp_specialized.cu").read_text()


def _const(src: str, name: str) -> int:
    return int(re.search(rf"\b{name} = (\d+);", src).group(1))


BLOCK_M = _const(TILE_SRC, "BLOCK_M")
WARP_M = _const(TILE_SRC, "WARP_M")
COMPUTE_WARPS = BLOCK_M // WARP_M
BLOCK_N_05 = _const(SRC05, "BLOCK_N")
BLOCK_N_06 = {64: _const(SRC06, "BLOCK_N_D64"), 128: _const(SRC06, "BLOCK_N_D128")}


# ---------------------------------------------------------------------------------------------
# 1. The numerics of the tile loop
# ---------------------------------------------------------------------------------------------

def tile_loop_model(q, k, v, causal: bool, scale: float, block_n: int, *, rescale: bool = True,
                    mask_diagonal: bool = True):
    """out[B, H, L, D] (fp16) as the chapter-5/6 kernels compute it. The keyword switches break
    the algorithm on purpose, to show the pass rule catches such bugs."""
    f32 = np.float32
    q, k, v = (t.numpy().astype(f32) for t in (q, k, v))  # fp16 values, exactly
    B, H, L, D = q.shape
    out = np.full((B, H, L, D), np.nan, np.float16)        # poisoned: unwritten rows stay NaN
    lane_half = (np.arange(block_n) % 4) // 2              # which lane of a row's pair owns column c
    for b in range(B):
        for h in range(H):
            for q0 in range(0, L, BLOCK_M):                # one block
                rows = q0 + np.arange(BLOCK_M)
                q_t = np.zeros((BLOCK_M, D), f32)
                q_t[: min(BLOCK_M, L - q0)] = q[b, h, q0:q0 + BLOCK_M]
                key_limit = np.minimum(L, rows + 1) if causal else np.full(BLOCK_M, L)
                if not mask_diagonal:
                    key_limit = np.full(BLOCK_M, L)
                m = np.full(BLOCK_M, -np.inf, f32)
                l = np.zeros((BLOCK_M, 2), f32)            # the two lanes' shares of the row sum
                o = np.zeros((BLOCK_M, D), f32)
                key_end = min(q0 + BLOCK_M, L) if causal else L
                for kv0 in range(0, -(-key_end // block_n) * block_n, block_n):
                    k_t = np.zeros((block_n, D), f32)
                    v_t = np.zeros((block_n, D), f32)
                    n = min(block_n, L - kv0)
                    k_t[:n], v_t[:n] = k[b, h, kv0:kv0 + n], v[b, h, kv0:kv0 + n]
                    s = (q_t @ k_t.T).astype(f32) * f32(scale)
                    keys = kv0 + np.arange(block_n)
                    s = np.where(keys[None, :] < key_limit[:, None], s, f32(-np.inf))
                    m_new = np.maximum(m, s.max(axis=1))
                    with np.errstate(invalid="ignore"):
                        corr = np.where(m_new == -np.inf, f32(0), np.exp(m - m_new, dtype=f32))
                        p = np.where(m_new[:, None] == -np.inf, f32(0), np.exp(s - m_new[:, None], dtype=f32))
                    for half in (0, 1):
                        l[:, half] = l[:, half] * corr + p[:, lane_half == half].sum(axis=1, dtype=f32)
                    if rescale:
                        o = np.where((corr != 1)[:, None], o * corr[:, None], o)
                    o = o + p.astype(np.float16).astype(f32) @ v_t
                    m = m_new
                inv_l = f32(1) / (l[:, 0] + l[:, 1])
                valid = min(BLOCK_M, L - q0)
                out[b, h, q0:q0 + valid] = (o * inv_l[:, None])[:valid].astype(np.float16)
    return torch.from_numpy(out)


MODEL_SHAPES = [Shape(1, 2, 1, 64), Shape(1, 2, 17, 64), Shape(1, 1, 200, 128), Shape(1, 2, 333, 64)]


def _judge(shape, causal, block_n, **broken):
    q, k, v = make_inputs(shape, seed=0, device="cpu")
    ref = reference_attention(q, k, v, causal)
    fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    out = tile_loop_model(q, k, v, causal, shape.D ** -0.5, block_n, **broken)
    return judge(out, ref, fp16_err)


@pytest.mark.parametrize("chapter", [5, 6])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", MODEL_SHAPES, ids=lambda s: s.label())
def test_tile_loop_model_meets_pass_rule(shape, causal, chapter):
    block_n = BLOCK_N_05 if chapter == 5 else BLOCK_N_06[shape.D]
    verdict = _judge(shape, causal, block_n)
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("broken", [{"rescale": False}, {"mask_diagonal": False}], ids=str)
def test_model_catches_a_broken_algorithm(broken):
    """The same check fails without the O rescale or without the mask inside the diagonal tile."""
    shape = Shape(1, 2, 333, 64)
    causal = "mask_diagonal" in broken
    assert not _judge(shape, causal, BLOCK_N_05, **broken).passed


def test_causal_tile_count_matches_the_diagonal():
    """Causal blocks visit exactly the tiles holding keys <= their last valid row."""
    L = 333
    for bn in {BLOCK_N_05, *BLOCK_N_06.values()}:
        for q0 in range(0, L, BLOCK_M):
            n_tiles = -(-min(q0 + BLOCK_M, L) // bn)
            last_row = min(q0 + BLOCK_M, L) - 1
            assert (n_tiles - 1) * bn <= last_row < n_tiles * bn


# ---------------------------------------------------------------------------------------------
# 2. The chapter-6 schedule
# ---------------------------------------------------------------------------------------------

def _norm(src: str) -> str:
    return re.sub(r"\s+", " ", src)


def test_kernel_source_has_the_simulated_protocol():
    """The simulation below mirrors these lines of kernels/06_warp_specialized.cu."""
    src = _norm(SRC06)
    for line in [
        "int full_bar(int stage) { return 1 + stage; }",
        "int empty_bar(int stage) { return 1 + STAGES + stage; }",
        "constexpr int LAG = STAGES - 1;",
        "for (int t0 = 0; t0 < n_tiles + LAG; t0 += STAGES)",
        "if (t >= n_tiles + LAG) break;",
        "if (t >= STAGES) attn::bar_sync(empty_bar<STAGES>(s), COUNT);",
        "attn::cp_async_commit(); if (t >= LAG) { attn::cp_async_wait<LAG>();",
        "attn::bar_arrive(full_bar((s + STAGES - LAG) % STAGES), COUNT);",
        "for (int t0 = 0; t0 < n_tiles; t0 += STAGES)",
        "attn::bar_sync(full_bar(s), COUNT);",
        "if (t + STAGES < n_tiles) attn::bar_arrive(empty_bar<STAGES>(s), COUNT);",
        "static constexpr int PRODUCER_THREADS = PRODUCERS * 32;",
        "static constexpr int THREADS = CONSUMER_THREADS + PRODUCER_THREADS;",
        "static constexpr int BARRIER_THREADS = THREADS;",
        "constexpr int CONSUMER_THREADS = COMPUTE_WARPS * 32;",
        "constexpr int COUNT = Roles<PRODUCERS>::BARRIER_THREADS;",
    ]:
        assert line in src, f"06_warp_specialized.cu no longer contains: {line}"
    # Every barrier call uses the one count, and the role split is by whole warps.
    assert set(re.findall(r"bar_(?:sync|arrive)\([^;]*, (\w+)\);", src)) == {"COUNT"}
    assert "if (warp >= COMPUTE_WARPS) {" in src
    # The ids fit the 16 hardware barriers and leave 0 (__syncthreads) alone.
    for stages in (1, 2, 3):
        ids = [1 + s for s in range(stages)] + [1 + stages + s for s in range(stages)]
        assert len(set(ids)) == 2 * stages and min(ids) >= 1 and max(ids) <= 15


def full_bar(s):
    return 1 + s


def empty_bar(s, stages):
    return 1 + stages + s


def producer_program(stages, n_tiles):
    """The producer loop of produce() in kernels/06_warp_specialized.cu, one warp."""
    lag = stages - 1
    for t0 in range(0, n_tiles + lag, stages):
        for s in range(stages):
            t = t0 + s
            if t >= n_tiles + lag:
                break
            if t < n_tiles:
                if t >= stages:
                    yield ("sync", empty_bar(s, stages), t - stages)
                yield ("issue", s, t)
            yield ("commit",)
            if t >= lag:
                yield ("wait_group", lag)
                yield ("arrive", full_bar((s + stages - lag) % stages), t - lag)


def consumer_program(stages, n_tiles, **broken):
    """The consumer loop of forward() in kernels/06_warp_specialized.cu, one warp."""
    for t0 in range(0, n_tiles, stages):
        for s in range(stages):
            t = t0 + s
            if t >= n_tiles:
                break
            yield ("sync", full_bar(s), t)
            yield ("read", s, t)   # K, in warp_scores
            yield ("read", s, t)   # V, in warp_pv
            if t + stages < n_tiles or broken.get("always_release"):
                yield ("arrive", empty_bar(s, stages), t)


class ProtocolError(AssertionError):
    pass


def simulate(stages, producers, n_tiles, rng, *, consumers=COMPUTE_WARPS, policy="random",
             producer_program=producer_program, **broken):
    """Run the warps in an order drawn by `rng` (or a biased policy); raise ProtocolError on a
    violation. Warps are the unit: a barrier call by a warp counts its 32 threads. cp.async
    groups land at any later moment, in any order, or when wait_group forces them."""
    count = 32 * (consumers + producers)  # BARRIER_THREADS
    warps = {("P", i): producer_program(stages, n_tiles) for i in range(producers)}
    warps.update({("C", i): consumer_program(stages, n_tiles, **broken) for i in range(consumers)})
    pending = {w: next(g, None) for w, g in warps.items()}        # each warp's next action
    blocked: dict = {}                                             # warp -> barrier it waits on
    bars: dict = {}                                                # id -> {"n", "tags", "waiters", "kinds"}
    phases_done: dict = {}
    groups = {i: [] for i in range(producers)}                     # per producer: committed groups
    open_group = {i: [] for i in range(producers)}
    stage_tile = [None] * stages
    landed: dict = {}                                              # (stage, tile) -> producers landed
    reads_done: dict = {}                                          # (consumer, tile) -> reads

    def land(i, group):
        for s, t in group:
            if stage_tile[s] != t:
                raise ProtocolError(f"copy of tile {t} landed in stage {s} now holding tile {stage_tile[s]}")
            landed.setdefault((s, t), set()).add(i)

    def barrier_call(w, kind, bar, tag):
        b = bars.setdefault(bar, {"n": 0, "tags": set(), "waiters": [], "kinds": set(), "by_role": {}})
        b["n"] += 32
        b["by_role"][w[0]] = b["by_role"].get(w[0], 0) + 32
        b["tags"].add(tag)
        b["kinds"].add((w[0], kind))
        if kind == "sync":
            blocked[w] = bar
            b["waiters"].append(w)
        if b["n"] == count:
            if len(b["tags"]) != 1:
                raise ProtocolError(f"barrier {bar}: one phase mixes tiles {sorted(b['tags'])}")
            # One side waits, the other signals: never both kinds from one role.
            roles = {r for r, _ in b["kinds"]}
            if len(b["kinds"]) != len(roles):
                raise ProtocolError(f"barrier {bar}: a role both waits and signals in one phase")
            if b["by_role"] != {"P": 32 * producers, "C": 32 * consumers}:
                raise ProtocolError(f"barrier {bar}: phase completed by {b['by_role']} thread arrivals")
            for waiter in b["waiters"]:
                del blocked[waiter]
            phases_done[bar] = phases_done.get(bar, 0) + 1
            bars[bar] = {"n": 0, "tags": set(), "waiters": [], "kinds": set(), "by_role": {}}

    def step(w):
        action = pending[w]
        kind = action[0]
        role, idx = w
        if kind in ("sync", "arrive"):
            barrier_call(w, kind, action[1], action[2])
        elif kind == "issue":
            _, s, t = action
            if t >= stages:
                for c in range(consumers):
                    if reads_done.get((c, t - stages), 0) < 2:
                        raise ProtocolError(f"stage {s} refilled with tile {t} before consumer {c} "
                                            f"finished tile {t - stages}")
            if stage_tile[s] not in (None, t, t - stages):
                raise ProtocolError(f"stage {s} holds tile {stage_tile[s]} when tile {t} is issued")
            stage_tile[s] = t
            open_group[idx].append((s, t))
        elif kind == "commit":
            groups[idx].append(open_group[idx])
            open_group[idx] = []
        elif kind == "wait_group":
            n = action[1]
            keep = groups[idx][len(groups[idx]) - n:] if n else []
            for g in groups[idx][:len(groups[idx]) - n]:
                land(idx, g)
            groups[idx] = keep
        elif kind == "read":
            _, s, t = action
            if stage_tile[s] != t:
                raise ProtocolError(f"consumer {idx} reads tile {t} from stage {s} holding {stage_tile[s]}")
            if landed.get((s, t), set()) != set(range(producers)):
                raise ProtocolError(f"consumer {idx} reads tile {t} before every producer's copy landed")
            reads_done[(idx, t)] = reads_done.get((idx, t), 0) + 1
        pending[w] = next(warps[w], None)

    while True:
        runnable = [w for w, a in pending.items() if a is not None and w not in blocked]
        landable = [(i, j) for i in groups for j, g in enumerate(groups[i]) if g]
        if not runnable:
            break
        if policy == "producers_first":
            choice = next((w for w in runnable if w[0] == "P"), runnable[0])
        elif policy == "consumers_first":
            choice = next((w for w in runnable if w[0] == "C"), runnable[0])
        else:
            choice = rng.choice(runnable)
        if policy == "random" and landable and rng.random() < 0.3:  # a copy group lands early
            i, j = rng.choice(landable)
            land(i, groups[i][j])
            groups[i][j] = []
            continue
        step(choice)

    stuck = [w for w, a in pending.items() if a is not None]
    if stuck:
        raise ProtocolError(f"deadlock: {sorted(stuck)} wait on {sorted(set(blocked.values()))}")
    open_phases = {bar: b["n"] for bar, b in bars.items() if b["n"]}
    if open_phases:
        raise ProtocolError(f"barrier phases left open at exit (id: arrivals): {open_phases}")
    for i in groups:  # every non-empty copy group has landed by the producer's last wait
        if any(groups[i]):
            raise ProtocolError(f"producer {i} exits with copies in flight")
    # The number of phases per barrier: one FULL per tile, one EMPTY per refill.
    for s in range(stages):
        tiles = [t for t in range(n_tiles) if t % stages == s]
        assert phases_done.get(full_bar(s), 0) == len(tiles)
        assert phases_done.get(empty_bar(s, stages), 0) == sum(t + stages < n_tiles for t in tiles)
    assert all(reads_done.get((c, t)) == 2 for c in range(consumers) for t in range(n_tiles))


@pytest.mark.parametrize("producers", [1, 2])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_ring_schedule_is_safe_for_any_interleaving(stages, producers):
    rng = random.Random(stages * 10 + producers)
    for n_tiles in range(10):
        for policy in ("producers_first", "consumers_first"):
            simulate(stages, producers, n_tiles, rng, policy=policy)
        for _ in range(12):
            simulate(stages, producers, n_tiles, rng)


def _broken_producer_no_empty_wait(stages, n_tiles):
    for action in producer_program(stages, n_tiles):
        if action[0] != "sync":
            yield action


def _broken_producer_announces_early(stages, n_tiles):
    for action in producer_program(stages, n_tiles):
        if action[0] != "wait_group":
            yield action


@pytest.mark.parametrize("broken", ["no_empty_wait", "announces_early", "always_release"])
def test_simulation_catches_a_broken_protocol(broken):
    """Drop the EMPTY wait, the wait_group before FULL, or the `t + STAGES < n_tiles` guard:
    the simulation reports a refill before release, a read before landing, or an open phase."""
    kwargs = {}
    if broken == "no_empty_wait":
        kwargs["producer_program"] = _broken_producer_no_empty_wait
    elif broken == "announces_early":
        kwargs["producer_program"] = _broken_producer_announces_early
    else:
        kwargs["always_release"] = True
    rng = random.Random(0)
    with pytest.raises(ProtocolError):
        for _ in range(50):
            simulate(2, 1, 6, rng, **kwargs)
