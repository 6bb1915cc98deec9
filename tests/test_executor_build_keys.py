"""An executor library is keyed by the files its source includes, and by no other file: an edit
to one chapter's kernel leaves every other chapter's library (and the traces named after it)
cached, and an edit to a header rebuilds exactly the kernels that include it."""
from __future__ import annotations

import uuid

import pytest

from attnlab.executor import build
from attnlab.executor.build import ExecutorBuildError, build_library, included_files, library_key
from attnlab.kernels import registry
from attnlab.kernels.sources import source_files
from attnlab.paths import kernels_dir


@pytest.fixture
def tree(tmp_path):
    """A kernel that includes a header that includes another, beside a kernel it never includes."""
    (tmp_path / "k.cu").write_text('#include "outer.cuh"\n// #include "nowhere.cuh"\n'
                                   'extern "C" __global__ void k(float* x) { x[0] = inner(); }\n')
    (tmp_path / "outer.cuh").write_text('#pragma once\n  #  include "inner.cuh"\n#include <cuda_fp16.h>\n')
    (tmp_path / "inner.cuh").write_text("#pragma once\n__device__ inline float inner() { return 1.0f; }\n")
    (tmp_path / "other.cu").write_text('extern "C" __global__ void other(float* x) { x[0] = 2.0f; }\n')
    (tmp_path / "nowhere.cuh").write_text("#pragma once\n")  # named only in a line comment
    return tmp_path


def test_the_closure_follows_quoted_includes_through_headers(tree):
    names = [p.name for p in included_files(tree / "k.cu", (tree,))]
    assert names == ["inner.cuh", "k.cu", "outer.cuh"]  # not other.cu or nowhere.cuh, not <cuda_fp16.h>


def test_an_edit_outside_the_closure_keeps_the_key_and_one_inside_changes_it(tree):
    key = library_key("k.cu", ["k"], (), tree)
    (tree / "other.cu").write_text((tree / "other.cu").read_text() + "// edited\n")
    assert library_key("k.cu", ["k"], (), tree) == key
    (tree / "inner.cuh").write_text((tree / "inner.cuh").read_text() + "// edited\n")
    assert library_key("k.cu", ["k"], (), tree) != key


def test_a_source_outside_the_folder_is_one_clear_error(tree):
    with pytest.raises(ExecutorBuildError, match="not a .cu/.cuh file"):
        library_key("missing.cu", ["k"], (), tree)


def test_every_registered_kernel_includes_exactly_the_headers_the_registry_names():
    """The registry's sources key the nvcc builds and the records' fingerprints; the closure keys
    the executor's libraries. They must name the same .cu/.cuh files, or an edit to a header would
    rebuild one and not the other."""
    for spec in registry.KERNELS.values():
        named = {p.name for p in source_files(spec) if p.suffix in (".cu", ".cuh")}
        assert {p.name for p in included_files(spec.path, (kernels_dir(),))} == named, spec.id


def test_chapter_7_s_header_is_not_in_chapter_1_s_key():
    one = {p.name for p in included_files(kernels_dir() / "01_scalar.cu", (kernels_dir(),))}
    assert one == {"01_scalar.cu", "common.cuh"}


def test_a_header_of_kernels_that_a_kernel_elsewhere_includes_is_in_its_key(tree, tmp_path_factory, monkeypatch):
    """Readers', exercises' and mutants' kernels live outside kernels/ and include its headers,
    quoted or bracketed: an edit to such a header rebuilds them."""
    shared = tmp_path_factory.mktemp("kernels")
    (shared / "shared.cuh").write_text("#pragma once\n")
    (shared / "bracketed.cuh").write_text("#pragma once\n")
    monkeypatch.setattr(build, "kernels_dir", lambda: shared)
    (tree / "uses.cu").write_text('#include "shared.cuh"\n#include <bracketed.cuh>\n')
    key = library_key("uses.cu", ["k"], (), tree)
    for name in ("shared.cuh", "bracketed.cuh"):
        (shared / name).write_text((shared / name).read_text() + "// edited\n")
        assert library_key("uses.cu", ["k"], (), tree) != key, name
        key = library_key("uses.cu", ["k"], (), tree)


def test_an_include_the_closure_cannot_follow_fails_the_build(tmp_path):
    """An include through a macro names a file the key never saw: the build refuses it rather than
    read kernels/'s live copy, which would leave the library stale after an edit."""
    # A text of its own each run, so that no library cached by an earlier run can answer.
    (tmp_path / "by_macro.cu").write_text(f'// {uuid.uuid4()}\n#define HEADER "common.cuh"\n#include HEADER\n'
                                          'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n')
    assert (kernels_dir() / "common.cuh").is_file()
    with pytest.raises(ExecutorBuildError, match="common.cuh"):
        build_library("by_macro.cu", ["k"], (), tmp_path)
