"""Expected printed IR, and the structural hash: deterministic, stable across processes, and
sensitive to every part of the program (op, shape, dtype, constant, parameters, outputs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
from helpers import REPO, pythonpath

import fusec
import fusec.numpy as fnp
from fusec.ir import Eqn, Lit, Op, Program, Var

S = fusec.ShapeDtype


def three_ops(x, y):
    return fnp.exp(x) * y + 1.0


def _traced_ir(fn, *specs, **kw):
    return fusec.gpu_jit(fn, **kw).trace(*specs).ir


def test_three_op_program_prints_exactly():
    ir = _traced_ir(three_ops, S((3, 5)), S((5,)))
    expected = textwrap.dedent("""\
        { lambda a:f32[3,5] b:f32[5] .
            c:f32[3,5] = exp a
            d:f32[3,5] = mul c b
            e:f32[3,5] = add d 1.0:f32
          in (e) }""")
    assert str(ir) == expected


def test_trace_from_numpy_arrays_prints_the_same_as_from_shapedtypes():
    x = np.ones((3, 5), np.float32)
    y = np.ones((5,), np.float32)
    assert str(_traced_ir(three_ops, x, y)) == str(_traced_ir(three_ops, S((3, 5)), S((5,))))


def test_params_dtypes_and_literals_print_exactly():
    def f(x, n):
        s = x.sum(axis=1, keepdims=True)
        return fnp.where(s > 0, s, -1.5), (n + 2).astype("uint32")

    ir = _traced_ir(f, S((4, 6)), S((2, 3), "int32"))
    expected = textwrap.dedent("""\
        { lambda a:f32[4,6] b:i32[2,3] .
            c:f32[4] = sum axes=(1,) a
            d:f32[4,1] = reshape shape=(4,1) c
            e:bool[4,1] = gt d 0.0:f32
            f:f32[4,1] = where e d -1.5:f32
            g:i32[2,3] = add b 2:i32
            h:u32[2,3] = cast dtype=uint32 g
          in (f, h) }""")
    assert str(ir) == expected


def test_lowered_program_prints_kernels_with_their_bodies():
    lowered = fusec.gpu_jit(three_ops).lower(S((3, 5)), S((5,)))
    expected = textwrap.dedent("""\
        { lambda a:f32[3,5] b:f32[5] .
            c:f32[3,5] = kernel kind=elementwise name=k0_ew_exp_mul_add slots=(new,) a b
                { lambda a:f32[3,5] b:f32[5] .
                    c:f32[3,5] = exp a
                    d:f32[3,5] = mul c b
                    e:f32[3,5] = add d 1.0:f32
                  in (e) }
          in (c) }""")
    assert lowered.as_text("ir") == expected
    assert str(lowered.ir) == expected


def test_printing_is_deterministic():
    ir = _traced_ir(three_ops, S((3, 5)), S((5,)))
    assert str(ir) == str(ir) == ir.__str__()
    again = _traced_ir(three_ops, S((3, 5)), S((5,)))
    assert ir is not again
    assert str(again) == str(ir)
    assert again.hash() == ir.hash()
    assert ir.hash() == ir.hash()


def test_hash_is_sha256_hex():
    h = _traced_ir(three_ops, S((3, 5)), S((5,))).hash()
    assert len(h) == 64
    int(h, 16)


def test_hash_ignores_function_and_argument_names():
    def other_name(a, b):
        return fnp.exp(a) * b + 1.0

    assert _traced_ir(other_name, S((3, 5)), S((5,))).hash() == \
        _traced_ir(three_ops, S((3, 5)), S((5,))).hash()


def test_hash_differs_when_the_program_differs():
    base = _traced_ir(three_ops, S((3, 5)), S((5,))).hash()
    variants = {
        "other op": _traced_ir(lambda x, y: fnp.log(x) * y + 1.0, S((3, 5)), S((5,))),
        "other op order": _traced_ir(lambda x, y: fnp.exp(x) + y * 1.0, S((3, 5)), S((5,))),
        "other shape": _traced_ir(three_ops, S((4, 5)), S((5,))),
        "other broadcast": _traced_ir(three_ops, S((3, 5)), S((3, 1))),
        "other constant": _traced_ir(lambda x, y: fnp.exp(x) * y + 2.0, S((3, 5)), S((5,))),
        "other dtype": _traced_ir(three_ops, S((3, 5)), S((5,), "int32")),
        "other output": _traced_ir(lambda x, y: (fnp.exp(x) * y + 1.0, y), S((3, 5)), S((5,))),
        "other operand": _traced_ir(lambda x, y: fnp.exp(x) * x + 1.0, S((3, 5)), S((5,))),
    }
    hashes = {name: ir.hash() for name, ir in variants.items()}
    for name, h in hashes.items():
        assert h != base, f"hash unchanged for {name}"
    assert len(set(hashes.values())) == len(hashes), "two different variants share a hash"


def test_hash_differs_for_params():
    a = _traced_ir(lambda x: x.sum(axis=0), S((4, 6))).hash()
    b = _traced_ir(lambda x: x.sum(axis=1), S((4, 6))).hash()
    c = _traced_ir(lambda x: x.reshape(6, 4), S((4, 6))).hash()
    d = _traced_ir(lambda x: x.reshape(3, 8), S((4, 6))).hash()
    assert len({a, b, c, d}) == 4


def test_hash_of_hand_built_program_distinguishes_literals():
    def prog(lit):
        x = Var((4,), "float32")
        y = Var((4,), "float32")
        return Program([x], [Eqn(Op.ADD, (x, lit), (y,))], [y])

    assert prog(Lit(1.0, "float32")).hash() == prog(Lit(1.0, "float32")).hash()
    assert prog(Lit(1.0, "float32")).hash() != prog(Lit(2.0, "float32")).hash()
    assert prog(Lit(1.0, "float32")).hash() != prog(Lit(1, "int32")).hash()


_CHILD = textwrap.dedent("""
    import fusec, fusec.numpy as fnp
    S = fusec.ShapeDtype
    f = fusec.gpu_jit(lambda x, y: fnp.exp(x) * y + 1.0)
    t = f.trace(S((3, 5)), S((5,)))
    print(t.ir.hash())
    print(f.lower(S((3, 5)), S((5,))).ir.hash())
""")


def test_hash_is_identical_in_separate_processes():
    here_traced = _traced_ir(three_ops, S((3, 5)), S((5,))).hash()
    here_lowered = fusec.gpu_jit(three_ops).lower(S((3, 5)), S((5,))).ir.hash()
    results = []
    for seed in ("1", "2"):  # different str-hash seeds: nothing may depend on set/dict order
        env = dict(os.environ, PYTHONPATH=pythonpath(), PYTHONHASHSEED=seed,
                   XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                             text=True, timeout=120, cwd=str(REPO))
        assert out.returncode == 0, out.stderr
        results.append(out.stdout.split())
    assert results[0] == results[1] == [here_traced, here_lowered]
