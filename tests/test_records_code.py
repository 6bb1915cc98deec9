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
