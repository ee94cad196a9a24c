"""Key-path checkpoints: `save` and `load` (templates, placement, mismatches, and
saving to a path: atomic, through symbolic links, after killed saves)."""

import errno
import io
import itertools
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import ArrayLike, Int

import autostatic as asx
import autostatic.checkpoint._files as files
import autostatic.checkpoint._loading as loading
import autostatic.checkpoint._writing as writing
from autostatic import CheckpointError, load, save
from autostatic.checkpoint._source import Source

from .helpers import assert_same_arrays, AutoMLP, EqxMLP, needs_devices

KEY = jax.random.key(0)
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------- host / device


def test_eval_shape_template_loads_to_host_without_jax_arrays(tmp_path):
    model = AutoMLP(2, 4, KEY, scale=2.0)
    path = tmp_path / "model.safetensors"
    save(path, model)
    template = eqx.filter_eval_shape(AutoMLP, 2, 4, KEY, scale=2.0)
    live = len(jax.live_arrays())
    host = load(path, template, host=True)
    assert len(jax.live_arrays()) == live  # nothing was put on any device
    leaves = jtu.tree_leaves(host)
    assert leaves and all(type(x) is np.ndarray for x in leaves)
    assert_same_arrays(host, model)
    assert host.scale == 2.0 and host.layers[1].activation is jax.nn.relu
    assert jtu.tree_structure(host) == jtu.tree_structure(model)

    device = load(path, template)
    assert all(isinstance(x, jax.Array) for x in jtu.tree_leaves(device))
    assert_same_arrays(device, model)
    x = jnp.ones(4)
    assert jnp.array_equal(device(x), model(x))


@needs_devices(8)
def test_loads_with_the_template_sharding(tmp_path):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    model = AutoMLP(2, 8, KEY)
    save(tmp_path / "m.safetensors", model)

    def shard(leaf):
        spec = P("x", None) if leaf.ndim == 2 else P("x")
        return jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec)
        )

    template = jax.tree.map(shard, eqx.filter_eval_shape(AutoMLP, 2, 8, KEY))
    out = load(tmp_path / "m.safetensors", template)
    pairs = zip(jtu.tree_leaves(out), jtu.tree_leaves(template), strict=True)
    for got, want in pairs:
        assert got.sharding == want.sharding
        assert len(got.addressable_shards) == 8
    assert_same_arrays(out, model)

    # A concrete template keeps each array where it is.
    device = jax.devices()[3]
    on_3 = jax.device_put(model, device)
    out = load(tmp_path / "m.safetensors", on_3)
    assert all(x.devices() == {device} for x in jtu.tree_leaves(out))


def test_numpy_template_leaves_stay_numpy():
    tree = {"a": np.arange(3.0), "b": jnp.arange(2), "c": np.float32(2.5)}
    f = io.BytesIO()
    save(f, tree)
    f.seek(0)
    out = load(f, tree)
    assert type(out["a"]) is np.ndarray and isinstance(out["b"], jax.Array)
    assert type(out["c"]) is np.float32 and out["c"] == 2.5


# --------------------------------------------------------------------------- keys


def test_duplicate_key_paths_are_an_error():
    class Twice:
        def __init__(self, a, b):
            self.a, self.b = a, b

    jtu.register_pytree_with_keys(
        Twice,
        lambda t: (((jtu.GetAttrKey("w"), t.a), (jtu.GetAttrKey("w"), t.b)), None),
        lambda _, children: Twice(*children),
    )
    with pytest.raises(ValueError, match=r"\.w"):
        save(io.BytesIO(), Twice(jnp.zeros(2), jnp.ones(2)))


def test_shape_dtype_structs_cannot_be_saved():
    with pytest.raises(CheckpointError, match=r"\['w'\].*ShapeDtypeStruct"):
        save(io.BytesIO(), {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})


def test_64_bit_arrays_need_x64_or_host():
    tree = {"w": np.arange(3, dtype=np.float64)}
    f = io.BytesIO()
    save(f, tree)
    template = {"w": jax.ShapeDtypeStruct((3,), np.float64)}
    with pytest.raises(CheckpointError, match=r"\['w'\].*host=True"):
        load(io.BytesIO(f.getvalue()), template)
    out = load(io.BytesIO(f.getvalue()), template, host=True)
    assert out["w"].dtype == np.float64


def test_a_single_array_and_prng_keys():
    f = io.BytesIO()
    save(f, jnp.arange(3.0))
    out = load(io.BytesIO(f.getvalue()), jax.ShapeDtypeStruct((3,), jnp.float32))
    assert out.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(CheckpointError, match="<root>"):
        load(io.BytesIO(f.getvalue()), jax.ShapeDtypeStruct((4,), jnp.float32))
    with pytest.raises(CheckpointError, match=r"\['key'\].*key_data"):
        save(io.BytesIO(), {"key": jax.random.key(0)})


# --------------------------------------------------------------------------- mismatches


def test_one_error_lists_every_mismatch_and_nothing_is_read(monkeypatch):
    f = io.BytesIO()
    save(
        f,
        {
            "a": jnp.zeros(3),
            "b": jnp.zeros((2, 2)),
            "c": jnp.zeros(2),
            "gone": jnp.ones(1),
        },
    )
    template = {
        "a": jnp.zeros(4),  # shape
        "b": jnp.zeros((2, 2), jnp.bfloat16),  # dtype
        "c": jnp.zeros(2),  # fine
        "new": jax.ShapeDtypeStruct((5,), jnp.float32),  # missing from the file
    }
    reads = []
    original = Source.read_into
    monkeypatch.setattr(
        Source,
        "read_into",
        lambda s, o, v, w: (reads.append(w), original(s, o, v, w)),
    )
    with pytest.raises(CheckpointError) as info:
        load(io.BytesIO(f.getvalue()), template)
    message = str(info.value)
    assert "4 problems" in message
    assert "shape differs: ['a'] (template: float32[4], file: float32[3])" in message
    assert (
        "dtype differs: ['b'] (template: bfloat16[2,2], file: float32[2,2])" in message
    )
    assert "missing from the file: ['new'] (template: float32[5])" in message
    assert "not in the template: ['gone'] (file: float32[1])" in message
    assert "['c']" not in message
    assert reads == ["the header length", "the header"]  # no tensor was read


def test_strict_false_ignores_extra_tensors_but_not_missing_ones():
    f = io.BytesIO()
    save(f, {"a": jnp.arange(3.0), "extra": jnp.ones(2)})
    out = load(io.BytesIO(f.getvalue()), {"a": jnp.zeros(3)}, strict=False)
    assert out["a"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(CheckpointError, match=r"not in the template: \['extra'\]"):
        load(io.BytesIO(f.getvalue()), {"a": jnp.zeros(3)})
    with pytest.raises(
        CheckpointError, match=r"missing from the file: \['b'\]"
    ) as info:
        load(
            io.BytesIO(f.getvalue()),
            {"a": jnp.zeros(3), "b": jnp.zeros(1)},
            strict=False,
        )
    assert "extra" not in str(info.value)


def test_another_leaf_where_the_file_has_an_array_is_named():
    f = io.BytesIO()
    save(f, {"a": jnp.zeros(2), "b": jnp.ones(2)})
    with pytest.raises(CheckpointError, match=r"\['b'\].*the template has a str there"):
        load(io.BytesIO(f.getvalue()), {"a": jnp.zeros(2), "b": "name"})
    with pytest.raises(
        CheckpointError,
        match=r"not a float: \['b'\] \(template: the Python float 1.0, file: "
        r"float32\[2\]\)",
    ):
        load(io.BytesIO(f.getvalue()), {"a": jnp.zeros(2), "b": 1.0})


class _Counted(asx.AutoModule):
    linear: eqx.nn.Linear
    step: Int[ArrayLike, ""] = 0


def _bumped(steps: int) -> _Counted:
    model = _Counted(eqx.nn.Linear(2, 2, key=KEY))
    bump = jax.jit(lambda m: asx.tree_at(lambda m: m.step, m, m.step + 1))
    for _ in range(steps):
        model = bump(model)
    return model


@pytest.mark.parametrize("steps", [0, 5])
@pytest.mark.parametrize("strict", [True, False])
def test_a_step_counter_is_saved_and_loaded(tmp_path, steps, strict):
    # Annotated to hold arrays, the counter is a leaf: a Python int until a jitted
    # step makes it an array. Either way it is saved, and loaded into a template's
    # Python int, concrete or from `eqx.filter_eval_shape`, as the stored number.
    model = _bumped(steps)
    save(tmp_path / "m.safetensors", model)
    fresh = _Counted(eqx.nn.Linear(2, 2, key=jax.random.key(1)))
    abstract = eqx.filter_eval_shape(_Counted, eqx.nn.Linear(2, 2, key=KEY))
    for like in (fresh, abstract):
        out = load(tmp_path / "m.safetensors", like, strict=strict)
        assert type(out.step) is int and out.step == steps
        assert_same_arrays(out.linear, model.linear)


def test_numbers_are_saved_as_jax_makes_them_and_missing_ones_are_kept():
    f = io.BytesIO()
    save(f, {"w": jnp.ones(2), "lr": 0.5, "on": True, "n": 3})
    data = f.getvalue()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert {k: header[k]["dtype"] for k in ("['lr']", "['on']", "['n']")} == {
        "['lr']": "F32",
        "['on']": "BOOL",
        "['n']": "I32",
    }
    out = load(
        io.BytesIO(f.getvalue()), {"w": jnp.zeros(2), "lr": 0.0, "on": False, "n": 0}
    )
    assert (out["lr"], out["on"], out["n"]) == (0.5, True, 3)
    assert type(out["on"]) is bool
    # A file written without a number (before numbers were saved) keeps the template's.
    g = io.BytesIO()
    save(g, {"w": jnp.ones(2)})
    assert load(io.BytesIO(g.getvalue()), {"w": jnp.zeros(2), "n": 7})["n"] == 7
    with pytest.raises(CheckpointError, match=r"\['n'\] is the Python int 8589934592"):
        save(io.BytesIO(), {"n": 2**33})


def test_checkpoints_move_between_eqx_and_auto_modules(tmp_path):
    auto, eqx_model = AutoMLP(2, 3, KEY), EqxMLP(2, 3, jax.random.key(1))
    save(tmp_path / "eqx.safetensors", eqx_model)
    out = load(tmp_path / "eqx.safetensors", eqx.filter_eval_shape(AutoMLP, 2, 3, KEY))
    assert isinstance(out, AutoMLP)
    assert_same_arrays(out, eqx_model)
    save(tmp_path / "auto.safetensors", auto)
    back = load(tmp_path / "auto.safetensors", eqx_model)
    assert isinstance(back, EqxMLP)
    assert_same_arrays(back, auto)


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize("kind", ["str", "pathlib", "bytesio"])
def test_paths_and_file_objects(kind, tmp_path):
    model = AutoMLP(2, 3, KEY)
    template = eqx.filter_eval_shape(AutoMLP, 2, 3, KEY)
    if kind == "bytesio":
        f = io.BytesIO(b"prefix")
        f.seek(6)  # a checkpoint may start anywhere in a file object
        save(f, model)
        f.seek(6)
        out = load(f, template)
        assert f.tell() == len(f.getvalue())
    else:
        path = tmp_path / "m.safetensors"
        target = str(path) if kind == "str" else path
        save(target, model)
        assert os.listdir(tmp_path) == ["m.safetensors"]
        out = load(target, template)
    assert_same_arrays(out, model)


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_save_leaves_the_earlier_file_intact(error, tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    save(path, AutoMLP(2, 3, KEY))
    before = path.read_bytes()
    calls = []
    original = writing._write_tensor

    def failing(f, key, leaf, nbytes):
        calls.append(key)
        if len(calls) == 2:
            f.write(b"\0" * 5)  # partly written when it fails
            raise error
        original(f, key, leaf, nbytes)

    monkeypatch.setattr(writing, "_write_tensor", failing)
    with pytest.raises(type(error)):
        save(path, AutoMLP(2, 3, jax.random.key(7)))
    assert len(calls) == 2
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]
    monkeypatch.undo()
    assert_same_arrays(load(path, AutoMLP(2, 3, KEY)), AutoMLP(2, 3, KEY))


def test_a_full_disk_names_the_path_being_saved(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"

    def no_space(f, key, leaf, nbytes):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writing, "_write_tensor", no_space)
    with pytest.raises(OSError) as info:
        save(path, {"w": np.ones(3, np.float32)})
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(path)
    assert str(path) in str(info.value) and "No space left" in str(info.value)
    assert os.listdir(tmp_path) == []  # no temporary file left behind


def test_saving_over_a_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "private.safetensors"
    save(path, {"a": jnp.ones(2)})
    os.chmod(path, 0o600)
    save(path, {"a": jnp.zeros(2)})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def _count_fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = os.fsync

    def fsync(fd):
        calls.append(fd)
        original(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_durable_false_skips_both_fsyncs_and_stays_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    tree = {"a": np.arange(5, dtype=np.float32), "b": jnp.ones(3, jnp.bfloat16)}
    fsyncs = _count_fsyncs(monkeypatch)
    save(path, tree)
    assert len(fsyncs) == (2 if os.name == "posix" else 1)  # the file, then its folder
    before = path.read_bytes()
    del fsyncs[:]
    save(path, tree, durable=False)
    assert fsyncs == []
    assert path.read_bytes() == before  # the same bytes, through the same rename
    assert os.listdir(tmp_path) == ["m.safetensors"]
    assert_same_arrays(load(path, tree), tree)
    with pytest.raises(TypeError):
        save(path, tree, False)  # type: ignore[misc]  # keyword-only

    # Still atomic: a failure leaves the earlier file and no temporary file.
    def failing(f, key, leaf, nbytes):
        f.write(b"\0" * 5)
        raise OSError("disk full")

    monkeypatch.setattr(writing, "_write_tensor", failing)
    with pytest.raises(OSError, match="disk full"):
        save(path, {"a": np.zeros(5, np.float32)}, durable=False)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_durable_saves_start_writing_each_chunk_to_disk(tmp_path, monkeypatch):
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(files, "_WRITEBACK_CHUNK", 4096)
    monkeypatch.setattr(
        files, "_start_writeback", lambda: lambda fd, at, n: started.append((at, n))
    )
    tree = {
        "big": np.arange(10_000, dtype=np.float32),  # about ten chunks, split inside
        "half": np.arange(3, dtype=np.float16),
        "empty": np.zeros((0, 4), np.int8),
        "mid": np.arange(2500, dtype=np.int64),
    }
    path = tmp_path / "m.safetensors"
    save(path, tree)
    size = path.stat().st_size
    assert started and started[0][0] == 0
    for (at, n), (next_at, _) in itertools.pairwise(started):
        assert next_at == at + n  # contiguous, each range once
    assert all(n >= 4096 for _, n in started)
    assert size - 4096 < started[-1][0] + started[-1][1] <= size
    out = load(path, jax.tree.map(np.zeros_like, tree), host=True)
    assert all(np.array_equal(out[k], v) for k, v in tree.items())
    del started[:]
    save(path, tree, durable=False)
    assert started == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_sync_file_range_is_found_and_harmless(tmp_path):
    start = files._start_writeback()
    assert start is not None
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(b"x" * 10_000)
        f.flush()
        start(f.fileno(), 0, 10_000)
        start(f.fileno(), 1 << 40, 5)  # past the end: nothing to do
    with open(path, "rb") as f:
        start(f.fileno(), 0, 10)  # read-only: refused by the kernel, ignored
    assert path.read_bytes() == b"x" * 10_000
    # A real durable save of several chunks.
    tree = {"w": np.arange(5 << 20, dtype=np.float32), "b": np.ones(7, np.float16)}
    save(tmp_path / "m.safetensors", tree)
    out = load(tmp_path / "m.safetensors", tree)
    assert np.array_equal(out["w"], tree["w"]) and np.array_equal(out["b"], tree["b"])


@pytest.mark.parametrize("nbytes", [0, 4, 1000, (2 << 20) - 4, 2 << 20, 5_000_004])
def test_load_buffers_are_aligned_and_sized(nbytes):
    array = loading._aligned_empty((nbytes // 4,), np.dtype(np.float32))
    assert array.shape == (nbytes // 4,) and array.flags.writeable
    assert array.ctypes.data % loading._ALIGNMENT == 0 or not nbytes
    if nbytes >= loading._HUGE_PAGE and loading._MADV_HUGEPAGE is not None:
        assert array.ctypes.data % loading._HUGE_PAGE == 0
    array[:] = 1.5  # the whole buffer is usable
    assert float(array.sum()) == 1.5 * (nbytes // 4)


def test_large_tensors_load_into_huge_page_buffers(tmp_path):
    tree = {
        "w": np.arange(3 << 20, dtype=np.float32).reshape(3, 1 << 20),  # 12 MiB
        "v": np.arange(600_000, dtype=np.int32),  # 2.3 MiB, not whole huge pages
        "s": np.ones(3, np.float32),
    }
    path = tmp_path / "m.safetensors"
    save(path, tree)
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    host = load(path, template, host=True)
    for key, want in tree.items():
        assert type(host[key]) is np.ndarray and np.array_equal(host[key], want)
    host["w"][0, 0] = -1.0  # writable, and ours alone
    assert tree["w"][0, 0] == 0.0
    device = load(path, template)
    del host
    for key, want in tree.items():
        assert np.array_equal(np.asarray(device[key]), want)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links")
def test_saving_through_a_symbolic_link_replaces_its_target(tmp_path):
    (tmp_path / "runs").mkdir()
    real = tmp_path / "runs" / "step_100.safetensors"
    link = tmp_path / "latest.safetensors"
    save(real, {"a": np.zeros(2, np.float32)})
    os.chmod(real, 0o640)
    link.symlink_to(real)
    save(link, {"a": np.ones(2, np.float32)})
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert load(real, {"a": np.zeros(2, np.float32)})["a"].tolist() == [1.0, 1.0]
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["latest.safetensors", "runs"]
    assert os.listdir(tmp_path / "runs") == ["step_100.safetensors"]
    # A dangling link gets its target created, as open(link, "wb") would.
    dangling = tmp_path / "next.safetensors"
    dangling.symlink_to(tmp_path / "runs" / "step_200.safetensors")
    save(dangling, {"a": np.ones(2, np.float32)})
    assert dangling.is_symlink()
    assert (tmp_path / "runs" / "step_200.safetensors").is_file()


_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import autostatic
    import autostatic.checkpoint._writing as writing

    original = writing._write_tensor

    def write_then_hang(f, key, leaf, nbytes):
        original(f, key, leaf, nbytes)
        f.flush()
        print("writing", flush=True)
        time.sleep(600)  # killed here, in the middle of the save

    writing._write_tensor = write_then_hang
    autostatic.save(sys.argv[1], {"a": np.ones(1 << 20, np.float32), "b": np.ones(3, np.float16)})
    """
)


def _save_in_child(path: Path) -> subprocess.Popen:
    """A process that is in the middle of saving to `path` (its temporary file exists
    and is partly written) when this returns."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "writing\n"
    return child


def _temps(folder: Path) -> list[str]:
    return [name for name in os.listdir(folder) if name.endswith(".tmp")]


@pytest.mark.skipif(files.fcntl is None, reason="needs POSIX advisory locks")
def test_a_save_after_a_killed_save_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "m.safetensors"
    for _ in range(2):
        child = _save_in_child(path)
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert len(_temps(tmp_path)) == 2  # what the killed saves left
    assert all(os.path.getsize(tmp_path / name) >= 4 << 20 for name in _temps(tmp_path))
    save(path, {"a": np.zeros(2, np.float32)})
    assert os.listdir(tmp_path) == ["m.safetensors"]
    assert load(path, {"a": np.ones(2, np.float32)})["a"].tolist() == [0.0, 0.0]


@pytest.mark.skipif(files.fcntl is None, reason="needs POSIX advisory locks")
def test_a_save_in_progress_elsewhere_keeps_its_temporary_file(tmp_path):
    path = tmp_path / "m.safetensors"
    child = _save_in_child(path)
    try:
        (theirs,) = _temps(tmp_path)
        save(path, {"a": np.zeros(2, np.float32)})  # a concurrent save of the same path
        assert _temps(tmp_path) == [theirs]  # still locked by a live save: kept
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    save(path, {"a": np.zeros(2, np.float32)})
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_save_writes_into_a_fifo_and_a_character_device(tmp_path):
    tree = {"w": jnp.arange(3.0)}
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    save(fifo, tree)
    data = reader.communicate(timeout=60)[0]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a FIFO, not a new file
    assert_same_arrays(load(io.BytesIO(data), tree), tree)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file left
    save("/dev/null", tree)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_save_refuses_a_folder_naming_it(tmp_path):
    with pytest.raises(CheckpointError, match=r"it is a folder"):
        save(tmp_path, {"w": jnp.ones(2)})


def test_save_replaces_the_inode_so_other_hard_links_keep_the_old_file(tmp_path):
    path, link = tmp_path / "model.safetensors", tmp_path / "backup.safetensors"
    save(path, {"w": jnp.zeros(2)})
    os.link(path, link)
    save(path, {"w": jnp.ones(2)})
    np.testing.assert_array_equal(load(link, {"w": jnp.zeros(2)})["w"], [0.0, 0.0])
    np.testing.assert_array_equal(load(path, {"w": jnp.zeros(2)})["w"], [1.0, 1.0])
    assert os.stat(path).st_uid == os.getuid()


def test_save_into_a_missing_folder_names_the_path_given(tmp_path):
    target = tmp_path / "missing" / "model.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        save(target, {"w": jnp.ones(2)})
    assert info.value.filename == str(target)
    assert ".tmp" not in str(info.value)


def test_save_of_a_deleted_array_names_it_before_writing_a_byte():
    w = jnp.ones(3)
    tree = {"a": jnp.zeros(1), "w": w}
    w.delete()
    f = io.BytesIO()
    with pytest.raises(CheckpointError, match=r"\['w'\] has been deleted"):
        save(f, tree)
    assert f.getvalue() == b""


def test_error_quoting_a_lone_surrogate_key_prints():
    # A file written elsewhere: its JSON header may name a tensor "\ud800".
    header = json.dumps(
        {"\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    ).encode()
    data = len(header).to_bytes(8, "little") + header + np.ones(1, "<f4").tobytes()
    with pytest.raises(CheckpointError) as info:
        load(io.BytesIO(data), {"a": jnp.ones(1)})
    text = str(info.value)
    text.encode("utf-8")  # printable: no lone surrogate left in the message
    assert "\\ud800" in text
