"""Each primitive's facts in one table: result shape and dtype, numpy reference, WGSL expression,
and the tolerance a float32 GPU result is held to against a float64 numpy reference.

Adding an elementwise op means adding one :class:`Elementwise` row here (plus its :class:`Op` name
in :mod:`fusec.ir` and a user-facing function in :mod:`fusec.numpy`); codegen, the interpreter and
the numeric tests all read this table.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import dtypes
from .errors import ShapeError
from .ir import PREDICATE, Op, Shape

# --- shape rules ----------------------------------------------------------------------------------


def broadcast_shapes(*shapes: Shape) -> Shape:
    """numpy broadcasting; raises ShapeError with the shapes when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(ndim):
        dims = {s[len(s) - ndim + k] for s in shapes if len(s) - ndim + k >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(
                f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                f"(numpy rules: trailing dimensions must be equal or 1)"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


# --- WGSL literals --------------------------------------------------------------------------------


def wgsl_literal(value: Any, dtype: str) -> str:
    """A WGSL expression for a scalar constant of the given dtype; exact for float32 values. A
    float16 constant is rounded to float16 and written as the f32 it is computed as."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "int32":
        v = int(np.int32(value))
        return f"{v}i" if v != -(2**31) else "i32(-2147483647 - 1)"
    if dtype == "uint32":
        return f"{int(np.uint32(value))}u"
    if dtype == "float16":
        with np.errstate(over="ignore"):
            value = np.float16(value)
    f = float(np.float32(value))
    if math.isfinite(f):
        text = repr(f)
        return text + ("f" if ("." in text or "e" in text) else ".0f")
    bits = int(np.array(f, dtype=np.float32).view(np.uint32))
    return f"fusec_f32_bits({bits:#x}u)"  # inf and nan have no WGSL literal (see HELPERS)


# --- elementwise ----------------------------------------------------------------------------------

# Helper functions pasted once into any kernel that uses the op. A helper may call only helpers
# listed before it (emit._helpers finds them in that order).
#
# Special values: WGSL lets an implementation assume that no NaN or infinity occurs, and GPU
# compilers do (``x != x`` may fold to false), so NaN and infinity are recognised by testing the
# bits and produced as bit patterns, never by comparisons or 0/0.
#
# They come from fusec_f32_bits, not from bitcast<f32> of a constant: that is a constant
# expression, and WGSL's constant evaluation must reject a non-finite result (Tint, the compiler
# of Chrome's WebGPU, does: "value -inf cannot be represented as 'f32'"); a function's result is
# not one.
_NAN = "fusec_f32_bits(0x7fc00000u)"
_INF = "fusec_f32_bits(0x7f800000u)"
_NEG_INF = "fusec_f32_bits(0xff800000u)"

HELPERS = {
    "fusec_f32_bits": """
fn fusec_f32_bits(b: u32) -> f32 {
    return bitcast<f32>(b);
}
""",
    "fusec_isnan": """
fn fusec_isnan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}""",
    "fusec_isinf": """
fn fusec_isinf(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u;
}""",
    "fusec_isfinite": """
fn fusec_isfinite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) < 0x7f800000u;
}""",
    # a cast to float16 inside a kernel: x rounded to the nearest float16 value (ties to even),
    # kept as an f32, in integer arithmetic. f32(f16(x)) is not used: the H100's shader
    # compiler removed that round trip (the value came out unrounded; tests/test_float16.py).
    # Beyond f16's range (from 65520 up) infinity, as numpy; NaN and the infinities as they are;
    # below 2^-14, multiples of 2^-24 (f16's subnormals).
    # exp and log with numpy's special values: WGSL lets an implementation assume no NaN, and
    # SwiftShader (Chrome's WebGPU without a GPU) gave exp(NaN) = inf, log(NaN) = 89, and
    # log(x) = log|x| for negative x (numpy: NaN for all three), and log(0) = -88 (numpy: -inf)
    "fusec_exp": """
fn fusec_exp(x: f32) -> f32 {
    return select(exp(x), x, fusec_isnan(x));
}""",
    "fusec_log": """
fn fusec_log(x: f32) -> f32 {
    let r = select(log(x), fusec_f32_bits(0x7fc00000u), x < 0.0 || fusec_isnan(x));
    return select(r, fusec_f32_bits(0xff800000u), x == 0.0);  // (SwiftShader: log(0) = -88)
}""",
    "fusec_round_f16": """
fn fusec_round_f16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let a = b & 0x7fffffffu;
    let s = b & 0x80000000u;
    if (a >= 0x7f800000u) {
        return x;
    }
    if (a >= 0x477ff000u) {
        return bitcast<f32>(s | 0x7f800000u);
    }
    if (a < 0x38800000u) {
        return round(x * 16777216.0) * 5.9604644775390625e-8;
    }
    return bitcast<f32>(s | ((a + 0xfffu + ((a >> 13u) & 1u)) & 0xffffe000u));
}""",
    # float16 stores: the value rounded as numpy does first (fusec_round_f16), so that the
    # conversion is exact whatever the device's rounding (WGSL leaves it to the device, and lets
    # a finite value beyond f16's range give the largest finite f16; the H100's conversion did
    # not round to nearest: errors up to a whole unit in the last place)
    "fusec_f16": """
fn fusec_f16(x: f32) -> f16 {
    return f16(fusec_round_f16(x));
}""",
    # numpy's maximum/minimum (and max/min reductions, scans, scatters): a NaN operand is the
    # result; WGSL's max and min are IEEE maxNum/minNum and drop it
    # int32 max/min reductions compare order-preserving uint32 keys (the sign bit flipped): the
    # NVIDIA H100's Vulkan compiler got max(acc, -v) and min(acc, -v) wrong in a reduction loop
    # (1373 of 4096 column maxima of -x over 4 rows of int32; found by hypothesis), where these
    # selects on unsigned compares came out right
    "fusec_max_i32": """
fn fusec_max_i32(a: i32, b: i32) -> i32 {
    return select(b, a, (bitcast<u32>(a) ^ 0x80000000u) > (bitcast<u32>(b) ^ 0x80000000u));
}""",
    "fusec_min_i32": """
fn fusec_min_i32(a: i32, b: i32) -> i32 {
    return select(b, a, (bitcast<u32>(a) ^ 0x80000000u) < (bitcast<u32>(b) ^ 0x80000000u));
}""",
    "fusec_max_f32": """
fn fusec_max_f32(a: f32, b: f32) -> f32 {
    return select(select(max(a, b), b, fusec_isnan(b)), a, fusec_isnan(a));
}""",
    "fusec_min_f32": """
fn fusec_min_f32(a: f32, b: f32) -> f32 {
    return select(select(min(a, b), b, fusec_isnan(b)), a, fusec_isnan(a));
}""",
    "fusec_copysign": """
fn fusec_copysign(x: f32, y: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(x) & 0x7fffffffu) | (bitcast<u32>(y) & 0x80000000u));
}""",
    "fusec_erf": """
fn fusec_erf(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26: |error| < 1.5e-7; WGSL has no erf builtin.
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
            + t * (-1.453152027 + t * 1.061405429))));
    let r = sign(x) * (1.0 - p * exp(-x * x));
    return select(r, x, fusec_isnan(x));  // (exp(NaN) may be anything: see fusec_exp)
}""",
    "fusec_tanh": """
fn fusec_tanh(x: f32) -> f32 {
    // One exp2 and one division: 1 - 2 / (e^2|x| + 1) (e = inf gives 1; NaN stays NaN). Near 0
    // that cancels, so below 0.25 an odd series (error < 1e-8 relative there) takes over; the
    // sign is copied from x's bits. Max relative error 3.4e-7 on the H200. The builtin lost all
    // relative accuracy near 0 on lavapipe, and a 16-op chain with 3 tanh ran at 219-224 us with
    // it on the H200 against 190 us with this (the chain's memory time).
    let ax = abs(x);
    let e = exp2(ax * 2.8853900817779268);
    let big = 1.0 - 2.0 / (e + 1.0);
    let x2 = x * x;
    let small = ax * (1.0 + x2 * (-0.33333334 + x2 * (0.13333334 + x2 * (-0.053968254
                + x2 * 0.021869488))));
    let r = select(big, small, ax < 0.25);
    let t = bitcast<f32>(bitcast<u32>(r) | (bitcast<u32>(x) & 0x80000000u));
    return select(t, x, fusec_isnan(x));  // (exp2(NaN) may be anything: see fusec_exp)
}""",
    # written out over the exponent's 32 bits: software adapters end a shader's loops after
    # 65535 iterations in all (see codegen.SOFTWARE_LOOP_LIMIT), and a loop here, run for every
    # element a row kernel's loop visits, passed that (int32 ** over 22000 rows came out wrong)
    "fusec_ipow_u32": """
fn fusec_ipow_u32(x: u32, n: u32) -> u32 {
    // exact integer power by squaring, wrapping modulo 2^32 like numpy
    var r = 1u;
    var b = x;
""" + "\n".join(f"    r = select(r, r * b, (n & {1 << i}u) != 0u);\n    b = b * b;"
               for i in range(31)) + """
    return select(r, r * b, (n & 2147483648u) != 0u);
}""",
    # after fusec_ipow_u32, which it calls: two's complement products wrap to the same bits
    "fusec_ipow_i32": """
fn fusec_ipow_i32(x: i32, n: i32) -> i32 {
    if (n < 0) {
        if (x == 1i) { return 1i; }
        if (x == -1i) { return select(1i, -1i, (n & 1i) != 0i); }
        return 0i;
    }
    return bitcast<i32>(fusec_ipow_u32(bitcast<u32>(x), u32(n)));
}""",
    "fusec_pow": """
fn fusec_pow(x: f32, y: f32) -> f32 {
    // WGSL pow(x, y) is undefined for x < 0 and for x == 0; numpy is not. Nor does WGSL say what
    // pow of NaN or of an infinity is (lavapipe gave pow(NaN, 2.5) = 0, SwiftShader inf); numpy:
    // NaN, except x ** 0 = 1 ** y = (-1) ** +-inf = 1; +-0 and +-inf give 0 or inf, negative
    // where y is an odd integer and x negative.
    if (y == 0.0 || x == 1.0 || (x == -1.0 && fusec_isinf(y))) { return 1.0; }
    let nan = fusec_f32_bits(0x7fc00000u);
    if (fusec_isnan(x) || fusec_isnan(y)) { return nan; }
    let whole = floor(y) == y;
    let odd = whole && floor(y * 0.5) != y * 0.5;
    if (x == 0.0 || fusec_isinf(x)) {
        let big = (x == 0.0) == (y < 0.0);
        let m = select(0.0, fusec_f32_bits(0x7f800000u), big);
        return select(m, fusec_copysign(m, x), odd);
    }
    let r = pow(abs(x), y);
    if (x < 0.0) {
        if (!whole) { return nan; }
        if (odd) { return -r; }
    }
    return r;
}""",
    # --- logarithms and exponentials: lavapipe's log builtin loses all relative accuracy near 1
    # (log(1 + 1e-6) off by 0.4%; WGSL bounds it only to 2^-21 absolute on [0.5, 2]), so log1p and
    # log2 reduce to the core below, which uses no log builtin.
    "fusec_log1p_core": """
fn fusec_log1p_core(f: f32) -> f32 {
    // log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]. With s = f / (2 + f), log(1 + f) =
    // 2 atanh(s) = 2s + s R, R = 2s^2/3 + 2s^4/5 + ...; as 2s = f - s f,
    // log(1 + f) = f - s (f - R): the rounding of s only enters the correction s (f - R), about
    // f^2 / 2. |s| <= 0.1716, so the terms left out (from 2s^10/11) are below 2e-9 relative.
    let s = f / (2.0 + f);
    let z = s * s;
    let r = z * (0.6666667 + z * (0.4 + z * (0.2857143 + z * 0.22222222)));
    return f - s * (f - r);
}""",
    "fusec_log1p": f"""
fn fusec_log1p(x: f32) -> f32 {{
    if (fusec_isnan(x) || x < -1.0) {{ return {_NAN}; }}
    if (x == -1.0) {{ return {_NEG_INF}; }}
    if (fusec_isinf(x)) {{ return x; }}
    // near 0 the core takes x itself: 1 + x is never rounded
    if (x >= -0.29289323 && x <= 0.41421357) {{ return fusec_log1p_core(x); }}
    // elsewhere |log1p(x)| > 0.34, so the rounding of u = 1 + x (2^-24 relative) costs at most
    // 3 ULP. (The classic correction (x - (u - 1)) / u did not survive compilation on lavapipe:
    // log1p(6e-8) came out 1.2e-7, as if it were 0.) u = 2^k m, m in [sqrt(1/2), sqrt(2)):
    // log1p(x) = k ln2 + log(m)
    let b = bitcast<u32>(1.0 + x);  // 1 + x >= 2^-24: a normal number
    var k = i32(b >> 23u) - 127;
    var m = bitcast<f32>((b & 0x007fffffu) | 0x3f800000u);
    if (m > 1.4142135) {{
        m = m * 0.5;
        k = k + 1;
    }}
    // ln2 = 0.693115234375 (12 bits: k times it is exact) + 3.1946183e-5
    let fk = f32(k);
    return fk * 0.693115234375 + (fusec_log1p_core(m - 1.0) + fk * 3.1946183e-5);
}}""",
    "fusec_log2": f"""
fn fusec_log2(x: f32) -> f32 {{
    if (fusec_isnan(x) || x < 0.0) {{ return {_NAN}; }}
    if (x == 0.0) {{ return {_NEG_INF}; }}
    if (fusec_isinf(x)) {{ return x; }}
    // x = 2^k m with m in [sqrt(1/2), sqrt(2)): log2(x) = k + log(m) / ln2, m - 1 exact
    let sub = bitcast<u32>(x) < 0x00800000u;  // subnormal: scaled by 2^24 first
    let b = bitcast<u32>(select(x, x * 16777216.0, sub));
    var k = i32(b >> 23u) - select(127, 151, sub);
    var m = bitcast<f32>((b & 0x007fffffu) | 0x3f800000u);
    if (m > 1.4142135) {{
        m = m * 0.5;
        k = k + 1;
    }}
    return f32(k) + fusec_log1p_core(m - 1.0) * 1.4426950;
}}""",
    "fusec_expm1": """
fn fusec_expm1(x: f32) -> f32 {
    // |x| < 0.5: e^x - 1 = x (1 + x/2 (1 + x/3 (1 + ...))) to x^9/9! (the rest < 3e-10
    // relative), no cancellation; beyond, exp(x) - 1 keeps exp's accuracy within a factor 2.6.
    if (abs(x) < 0.5) {
        return x * (1.0 + x * 0.5 * (1.0 + x * 0.33333334 * (1.0 + x * 0.25 * (1.0 + x * 0.2
               * (1.0 + x * 0.16666667 * (1.0 + x * 0.14285715 * (1.0 + x * 0.125
               * (1.0 + x * 0.11111111))))))));
    }
    if (fusec_isnan(x)) { return x; }
    return exp(x) - 1.0;
}""",
    "fusec_sinh": """
fn fusec_sinh(x: f32) -> f32 {
    // lavapipe's builtin is (e^x - e^-x) / 2: no relative accuracy near 0 (sinh(1e-30) came out
    // 3e-8) and inf from |x| = 88.7, where sinh is finite up to 89.4.
    if (fusec_isnan(x)) { return x; }
    let a = abs(x);
    var r: f32;
    if (a < 9.0) {
        // with e = e^a - 1: e^a - e^-a = e + e / (e + 1)
        let e = fusec_expm1(a);
        r = 0.5 * (e + e / (e + 1.0));
    } else {
        // e^-a < 2^-25 e^a is negligible, and e^a / 2 = e^(a - ln 2) overflows only with sinh
        // (not (h / 2) h with h = e^(a/2): NVIDIA's compiler made that 0.5 (h h), inf from 88.7)
        r = exp(a - 0.6931472);
    }
    return fusec_copysign(r, x);
}""",
    # sin and cos: WGSL promises only 2^-11 absolute on [-pi, pi], and SwiftShader (Chrome's
    # WebGPU without a GPU) is that coarse: sin(1) off by 2e-5 relative, sin(1e-30) = 0. Below
    # |x| = 4096: x - q pi/2 in three steps (q c1 and q c2 exact: c1 has 8 significant bits, c2
    # 12, q < 2^12), then the quadrant's sine or cosine polynomial on [-pi/4, pi/4] (Cephes'
    # single-precision coefficients); beyond, the builtin.
    "fusec_sin_cos": """
fn fusec_sin_cos(x: f32, quadrant: i32) -> f32 {
    let q = round(x * 0.63661975);
    let r = ((x - q * 1.5703125) - q * 0.0004838705062866211) - q * -4.371138828673793e-08;
    let z = r * r;
    let sn = r + r * z * (-0.16666655 + z * (0.0083321609 + z * -0.00019515296));
    let cs = 1.0 - 0.5 * z + z * z * (0.041666646 + z * (-0.0013887316 + z * 2.4433157e-05));
    let n = (i32(q) + quadrant) & 3;
    let v = select(cs, sn, (n & 1) == 0);
    return select(v, -v, n >= 2);
}""",
    "fusec_sin": """
fn fusec_sin(x: f32) -> f32 {
    if (x == 0.0) { return x; }  // sin(-0) = -0 (the reduction's x - 0 q gives +0)
    if (abs(x) < 4096.0) { return fusec_sin_cos(x, 0); }
    return select(sin(x), fusec_f32_bits(0x7fc00000u), !fusec_isfinite(x));
}""",
    "fusec_cos": """
fn fusec_cos(x: f32) -> f32 {
    if (abs(x) < 4096.0) { return fusec_sin_cos(x, 1); }
    return select(cos(x), fusec_f32_bits(0x7fc00000u), !fusec_isfinite(x));
}""",
    "fusec_tan": """
fn fusec_tan(x: f32) -> f32 {
    // NVIDIA's tan (sin / cos at the hardware's absolute accuracy) lost all relative accuracy
    // for tiny x on the H100; below 1/16 the odd series to x^7 (the rest < 1e-11 relative)
    let x2 = x * x;
    if (abs(x) < 0.0625) {
        return x + x * x2 * (0.33333334 + x2 * (0.13333334 + x2 * 0.053968254));
    }
    return fusec_sin(x) / fusec_cos(x);
}""",
    "fusec_cosh": """
fn fusec_cosh(x: f32) -> f32 {
    // as fusec_sinh for large |x| (the builtin overflows from 88.7); below, a sum of positives
    if (fusec_isnan(x)) { return x; }
    let a = abs(x);
    if (a < 9.0) {
        let e = exp(a);
        return 0.5 * (e + 1.0 / e);
    }
    return exp(a - 0.6931472);
}""",
    # --- inverse trigonometric and hyperbolic functions: lavapipe's asin/acos were off by 4e-4
    # relative, atan/atan2 by 2e-5, atan(NaN) gave 0 and atan2 of signed zeros the wrong
    # quadrant; asinh/acosh/atanh lost relative accuracy near their zeros.
    "fusec_atan01": """
fn fusec_atan01(r: f32) -> f32 {
    // atan(r) for r in [0, 1]. Above tan(pi/8), atan(r) = pi/4 + atan((r - 1) / (r + 1)); then
    // |t| <= tan(pi/8) and the Taylor series to t^17 leaves out less than 7e-9 relative.
    let big = r > 0.41421357;
    let t = select(r, (r - 1.0) / (r + 1.0), big);
    let z = t * t;
    let p = t - t * z * (0.33333334 - z * (0.2 - z * (0.14285715 - z * (0.11111111 - z
            * (0.09090909 - z * (0.07692308 - z * (0.06666667 - z * 0.05882353)))))));
    return select(p, 0.7853982 + p, big);
}""",
    "fusec_atan": """
fn fusec_atan(x: f32) -> f32 {
    if (fusec_isnan(x)) { return x; }
    let a = abs(x);
    // above 2^25, pi/2 - 1/a rounds to pi/2 (and 1/a would need a divisor past 2^126)
    var r = 1.5707964;
    if (a <= 33554432.0) {
        let p = fusec_atan01(select(a, 1.0 / a, a > 1.0));
        r = select(p, 1.5707964 - p, a > 1.0);
    }
    return fusec_copysign(r, x);
}""",
    "fusec_atan2": f"""
fn fusec_atan2(y: f32, x: f32) -> f32 {{
    // numpy's quadrants, signed zeros and infinities included: atan2(+-0, -0) = +-pi,
    // atan2(+-inf, -inf) = +-3pi/4
    if (fusec_isnan(x) || fusec_isnan(y)) {{ return {_NAN}; }}
    let ax = abs(x);
    let ay = abs(y);
    let hi = max(ax, ay);
    let lo = min(ax, ay);
    var r = 0.0;  // lo / hi in [0, 1]; 0 when both are 0
    if (fusec_isinf(lo)) {{
        r = 1.0;
    }} else if (hi > 0.0) {{
        // scaled by a power of 2 (exact) so that the divisor stays in [2^-126, 2^126], where
        // WGSL bounds division's error
        let s = select(select(1.0, 18446744073709551616.0, hi < 5.421011e-20), 0.0625, hi > 1.0);
        r = (lo * s) / (hi * s);
    }}
    var a = fusec_atan01(r);
    if (ay > ax) {{ a = 1.5707964 - a; }}
    if ((bitcast<u32>(x) & 0x80000000u) != 0u) {{ a = 3.1415927 - a; }}
    return fusec_copysign(a, y);
}}""",
    "fusec_asin": f"""
fn fusec_asin(x: f32) -> f32 {{
    // atan2(x, sqrt(1 - x^2)), 1 - x^2 as (1 - |x|)(1 + |x|): exact subtraction near |x| = 1
    let a = abs(x);
    if (fusec_isnan(x) || a > 1.0) {{ return {_NAN}; }}
    return fusec_atan2(x, sqrt((1.0 - a) * (1.0 + a)));
}}""",
    "fusec_acos": f"""
fn fusec_acos(x: f32) -> f32 {{
    let a = abs(x);
    if (fusec_isnan(x) || a > 1.0) {{ return {_NAN}; }}
    return fusec_atan2(sqrt((1.0 - a) * (1.0 + a)), x);
}}""",
    "fusec_asinh": """
fn fusec_asinh(x: f32) -> f32 {
    if (fusec_isnan(x)) { return x; }
    let a = abs(x);
    var r: f32;
    if (a > 4096.0) {
        // log(2a) + 1/(4a^2) - ...: the second term is below 2e-9 relative here
        r = (fusec_log2(a) + 1.0) * 0.6931472;
    } else {
        // log(a + sqrt(1 + a^2)) = log1p(a + a^2 / (1 + sqrt(1 + a^2))): no cancellation
        r = fusec_log1p(a + a * a / (1.0 + sqrt(1.0 + a * a)));
    }
    return fusec_copysign(r, x);
}""",
    "fusec_acosh": f"""
fn fusec_acosh(x: f32) -> f32 {{
    if (fusec_isnan(x) || x < 1.0) {{ return {_NAN}; }}
    if (x > 4096.0) {{ return (fusec_log2(x) + 1.0) * 0.6931472; }}  // log(2x) - 1/(4x^2) - ...
    // log(x + sqrt(x^2 - 1)) = log1p(t + sqrt(t (x + 1))), t = x - 1 exact for x <= 2
    let t = x - 1.0;
    return fusec_log1p(t + sqrt(t * (x + 1.0)));
}}""",
    "fusec_atanh": f"""
fn fusec_atanh(x: f32) -> f32 {{
    let a = abs(x);
    if (fusec_isnan(x) || a > 1.0) {{ return {_NAN}; }}
    // log((1 + a) / (1 - a)) / 2 = log1p(2a / (1 - a)) / 2; 1 - a is exact near 1
    let r = select(0.5 * fusec_log1p(2.0 * a / (1.0 - a)), {_INF}, a == 1.0);
    return fusec_copysign(r, x);
}}""",
    # --- division and remainders
    "fusec_fmod": f"""
fn fusec_fmod(x: f32, y: f32) -> f32 {{
    // C's fmod, exact as numpy's: WGSL's % is x - y trunc(x / y), wrong once x / y is large. On the
    // integer significands: |x| = mx 2^(ex - 150), |y| = my 2^(ey - 150) (ex >= ey), so
    // fmod = ((mx 2^(ex - ey)) mod my) 2^(ey - 150), the power of 2 applied 8 bits at a time
    // (r < 2^24 keeps r << 8 in 32 bits), written out rather than looped: software adapters end a
    // shader's loops after 65535 iterations in all (see fusec_ipow_u32).
    let bx = bitcast<u32>(x) & 0x7fffffffu;
    let by = bitcast<u32>(y) & 0x7fffffffu;
    let sx = bitcast<u32>(x) & 0x80000000u;
    if (bx >= 0x7f800000u || by > 0x7f800000u || by == 0u) {{ return {_NAN}; }}
    if (bx < by) {{ return x; }}  // |x| < |y|, y = +-inf included
    var ex = bx >> 23u;
    var mx = bx & 0x007fffffu;
    if (ex == 0u) {{ ex = 1u; }} else {{ mx = mx | 0x00800000u; }}
    var ey = by >> 23u;
    var my = by & 0x007fffffu;
    if (ey == 0u) {{ ey = 1u; }} else {{ my = my | 0x00800000u; }}
    var r = mx % my;
    var d = ex - ey;
""" + "\n".join("    if (d >= 8u) { r = (r << 8u) % my; d = d - 8u; }" for _ in range(31)) + """
    r = (r << d) % my;
    if (r == 0u) { return bitcast<f32>(sx); }
    // r 2^(ey - 150) = (r 2^-23) 2^(ey - 127): both products exact
    let v = (f32(r) * 1.1920928955078125e-7) * bitcast<f32>(ey << 23u);
    return bitcast<f32>(bitcast<u32>(v) | sx);
}""",
    "fusec_rem": """
fn fusec_rem(x: f32, y: f32) -> f32 {
    // numpy's remainder takes the divisor's sign: fmod, plus y where the signs differ (exact
    // when |x| >= |y|; else m = x and x + y rounds once, as in numpy); x % 0, inf % y and NaN
    // give NaN
    let m = fusec_fmod(x, y);
    if (fusec_isnan(m)) { return m; }
    let sy = bitcast<u32>(y) & 0x80000000u;
    if (m == 0.0) { return bitcast<f32>(sy); }
    if ((bitcast<u32>(m) & 0x80000000u) != sy) { return m + y; }
    return m;
}""",
    "fusec_floordiv": f"""
fn fusec_floordiv(x: f32, y: f32) -> f32 {{
    let sign = (bitcast<u32>(x) ^ bitcast<u32>(y)) & 0x80000000u;
    if (y == 0.0) {{  // numpy gives x / 0: +-inf, NaN for 0 / 0 and NaN / 0
        return select(bitcast<f32>(sign | 0x7f800000u), {_NAN}, x == 0.0 || fusec_isnan(x));
    }}
    let m = fusec_fmod(x, y);
    if (fusec_isnan(m)) {{ return m; }}  // x infinite or NaN, y NaN
    // x - m is a multiple of y: the quotient is an integer up to the roundings of x - m and of
    // the division (rounded off); one less where numpy's remainder, m + y, differs from m. The
    // divisor is scaled into [2^-126, 2^126] (exactly: x - m is 0 or at least |y|).
    let ay = abs(y);
    let s = select(select(1.0, 16777216.0, ay < 1.1754944e-38), 0.25, ay > 1.0);
    var q = round(((x - m) * s) / (y * s));
    if (m != 0.0 && (bitcast<u32>(m) & 0x80000000u) != (bitcast<u32>(y) & 0x80000000u)) {{
        q = q - 1.0;
    }}
    if (q == 0.0) {{ return bitcast<f32>(sign); }}  // a zero with the sign of x / y, as numpy
    return q;
}}""",
    # Signed integer division and remainder on magnitudes, in u32: WGSL's i32 % came out wrong on
    # NVIDIA's Vulkan driver (H100: fmod(-100, 7) gave 2147483548, the bits of -100 % 7 with the
    # sign bit moved), as its i32 min/max did (see _minmax). u32 / and % were right.
    "fusec_fmod_i32": """
fn fusec_fmod_i32(x: i32, y: i32) -> i32 {
    // C's fmod: the remainder takes x's sign; x % 0 is 0 (numpy); INT_MIN % -1 is 0
    if (y == 0i) { return 0i; }
    let ax = select(bitcast<u32>(x), 0u - bitcast<u32>(x), x < 0i);
    let ay = select(bitcast<u32>(y), 0u - bitcast<u32>(y), y < 0i);
    let r = ax % ay;
    return select(bitcast<i32>(r), bitcast<i32>(0u - r), x < 0i);
}""",
    "fusec_floordiv_i32": """
fn fusec_floordiv_i32(x: i32, y: i32) -> i32 {
    // numpy: x // 0 is 0; INT_MIN // -1 wraps to INT_MIN
    if (y == 0i) { return 0i; }
    let ax = select(bitcast<u32>(x), 0u - bitcast<u32>(x), x < 0i);
    let ay = select(bitcast<u32>(y), 0u - bitcast<u32>(y), y < 0i);
    let q = ax / ay;
    if ((x < 0i) == (y < 0i)) { return bitcast<i32>(q); }
    // the signs differ: -q, one lower when the division was not exact (floor, not truncation)
    return bitcast<i32>(0u - q - select(0u, 1u, q * ay != ax));
}""",
    "fusec_rem_i32": """
fn fusec_rem_i32(x: i32, y: i32) -> i32 {
    // numpy: x % 0 is 0; the result takes y's sign
    let r = fusec_fmod_i32(x, y);
    return select(r, r + y, r != 0i && ((r < 0i) != (y < 0i)));
}""",}


def _arg_helper(largest: bool, ty: str) -> str:
    """``fusec_arg{max,min}_{ty}(va, ia, vb, ib)``: does (vb, ib) come before (va, ia) in argmax
    (argmin) order, that is the first NaN, else the larger (smaller) value, else the smaller
    index? Indices are non-negative, so compared as u32 (see fusec_min_i32 for why the H100's
    i32 compares are avoided); int32 values are compared as order-preserving u32 keys."""
    cmp = ">" if largest else "<"
    name = f"fusec_arg{'max' if largest else 'min'}_{ty}"
    key = {"f32": "{}", "u32": "{}", "i32": "(bitcast<u32>({}) ^ 0x80000000u)"}[ty]
    a, b = key.format("va"), key.format("vb")
    order = f"{b} {cmp} {a} || ({b} == {a} && first)"
    if ty == "f32":
        body = (f"    let na = fusec_isnan(va);\n    let nb = fusec_isnan(vb);\n"
                f"    return select(select({order}, false, na), !na || first, nb);")
    else:
        body = f"    return {order};"
    return (f"\nfn {name}(va: {ty}, ia: i32, vb: {ty}, ib: i32) -> bool {{\n"
            f"    let first = bitcast<u32>(ib) < bitcast<u32>(ia);\n{body}\n}}")


# argmax / argmin as one pass of (value, index) pairs (codegen._first_index)
HELPERS.update({f"fusec_arg{kind}_{ty}": _arg_helper(kind == "max", ty)
                for kind in ("max", "min") for ty in ("f32", "i32", "u32")})


@dataclass(frozen=True)
class Elementwise:
    """Facts about one elementwise primitive."""

    op: Op
    numpy: Callable[..., Any]  # reference on numpy arrays of the operand dtype
    wgsl: Callable[[Sequence[str], str], str]  # (operand expressions, operand dtype) -> expression
    float_only: bool = False  # trace casts integer operands to float32 first
    bool_ok: bool = True
    # (rtol, atol) of the GPU float32 result against a float64 reference, from WGSL's accuracy rules
    # (e.g. exp: 3 + 2|x| ULP; division 2.5 ULP) and measured on lavapipe and the H100/H200.
    tol: tuple[float, float] = (1e-6, 0.0)
    # g * d(out)/d(operand i) (see "derivatives of the elementwise ops"); None: not
    # differentiable (results that are not floats: predicates, bitwise ops, integer division)
    deriv: Optional[Callable[..., Any]] = None


def _div(a: Sequence[str], dt: str) -> str:
    """x / y. A literal zero divisor is written as a product with an infinity: naga folds
    ``x / 0.0f`` to 0 (lavapipe gave 0 for 1 / 0.0), where numpy gives +-inf, or nan for 0 / 0,
    as x * inf does."""
    if a[1] in ("0.0f", "-0.0f"):
        inf = _NEG_INF if a[1].startswith("-") else _INF
        return f"({a[0]} * {inf})"
    return f"({a[0]} / {a[1]})"


def _neg(a: Sequence[str], dt: str) -> str:
    return f"(0u - {a[0]})" if dt == "uint32" else f"(-{a[0]})"


def _abs(a: Sequence[str], dt: str) -> str:
    return a[0] if dt in ("uint32", "bool") else f"abs({a[0]})"


def _bin(sym: str, bool_sym: str | None = None) -> Callable[[Sequence[str], str], str]:
    def f(a: Sequence[str], dt: str) -> str:
        if dt == "bool" and bool_sym is not None:
            return f"({a[0]} {bool_sym} {a[1]})"
        if dt == "bool" and sym in ("<", "<=", ">", ">="):
            return f"(u32({a[0]}) {sym} u32({a[1]}))"
        return f"({a[0]} {sym} {a[1]})"

    return f


def _call(name: str, bool_sym: str | None = None) -> Callable[[Sequence[str], str], str]:
    def f(a: Sequence[str], dt: str) -> str:
        if dt == "bool" and bool_sym is not None:
            return f"({a[0]} {bool_sym} {a[1]})"
        return f"{name}({', '.join(a)})"

    return f


def _minmax(cmp: str, name: str, bool_sym: str) -> Callable[[Sequence[str], str], str]:
    """Integer min and max as selects: NVIDIA's Vulkan compiler (driver 580, H200) computed x for
    the int32 min(min(x, -abs(x)), abs(x)) in some processes; the select form was right. Floats
    go through fusec_max_f32/fusec_min_f32, which return a NaN operand as numpy and JAX do (WGSL's
    max/min return the number: IEEE maxNum)."""
    builtin = _call(name, bool_sym)

    def f(a: Sequence[str], dt: str) -> str:
        if dt in ("int32", "uint32"):
            return f"select({a[1]}, {a[0]}, {a[0]} {cmp} {a[1]})"
        if dtypes.is_float(dt):
            return f"fusec_{name}_f32({a[0]}, {a[1]})"
        return builtin(a, dt)

    return f


def _by_dtype(float_expr: str | None, int32_expr: str | None = None, uint32_expr: str | None = None,
              bool_expr: str | None = None) -> Callable[[Sequence[str], str], str]:
    """An expression per operand dtype, written with {0}, {1} for the operands; a dtype without
    one is never traced to this op (fusec.numpy refuses or casts it first)."""
    table = {"float32": float_expr, "int32": int32_expr, "uint32": uint32_expr, "bool": bool_expr}

    def f(a: Sequence[str], dt: str) -> str:
        expr = table[dtypes.compute_dtype(dt)]
        if expr is None:
            raise AssertionError(f"no WGSL for dtype {dt}")
        return expr.format(*a)

    return f


def _rounding(name: str) -> Callable[[Sequence[str], str], str]:
    """floor, ceil, trunc, round: the builtin for floats; integers and bools are already whole."""
    def f(a: Sequence[str], dt: str) -> str:
        return f"{name}({a[0]})" if dtypes.is_float(dt) else a[0]

    return f


def _shift(left: bool) -> Callable[[Sequence[str], str], str]:
    """numpy's shifts: WGSL uses only the low 5 bits of the amount, numpy shifts by the whole
    amount (an amount of 32 or more, or a negative one, read as unsigned, shifts everything out:
    0, or -1 for a negative int32 shifted right)."""
    def f(a: Sequence[str], dt: str) -> str:
        x, n = a
        if dt == "uint32":
            return f"select(0u, {x} {'<<' if left else '>>'} {n}, {n} < 32u)"
        out = "0i" if left else f"select(0i, -1i, {x} < 0i)"
        return f"select({out}, {x} {'<<' if left else '>>'} u32({n}), u32({n}) < 32u)"

    return f


def _np_round(x: np.ndarray) -> np.ndarray:
    return np.rint(x) if x.dtype.kind == "f" else x


def _np_isnan(x: np.ndarray) -> np.ndarray:
    return np.isnan(x) if x.dtype.kind == "f" else np.zeros(np.shape(x), bool)


def _np_isinf(x: np.ndarray) -> np.ndarray:
    return np.isinf(x) if x.dtype.kind == "f" else np.zeros(np.shape(x), bool)


def _np_isfinite(x: np.ndarray) -> np.ndarray:
    return np.isfinite(x) if x.dtype.kind == "f" else np.ones(np.shape(x), bool)


def _pow(a: Sequence[str], dt: str) -> str:
    fn = {"float32": "fusec_pow", "int32": "fusec_ipow_i32",
          "uint32": "fusec_ipow_u32"}[dtypes.compute_dtype(dt)]
    return f"{fn}({a[0]}, {a[1]})"


def _np_power(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """numpy's power; for integers, negative exponents give 0 (1 or -1 for bases 1 and -1) where
    numpy would raise, as the GPU computes them."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind == "f":
        return np.power(x, y)
    if x.dtype.kind == "i":
        neg = y < 0
        safe = np.power(x, np.where(neg, 0, y))
        special = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 == 0, 1, -1), 0))
        return np.where(neg, special, safe).astype(x.dtype)
    return np.power(x, y)


def _np_erf(x: np.ndarray) -> np.ndarray:
    # scipy's vectorised erf where scipy is installed (it comes with scikit-learn): the interpreter
    # spent most of a BERT encoder's time in math.erf one element at a time (1.47 s per batch of
    # 24x37 on the CI machine's 2 cores, of which about 0.9 s in erf)
    try:
        from scipy.special import erf
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)
    # (scipy has a float32 loop: the same values as through float64, without the two copies)
    return np.asarray(erf(x)).astype(x.dtype, copy=False)


def _np_bool_safe(fn: Callable[..., Any], bool_fn: Callable[..., Any]) -> Callable[..., Any]:
    def f(*xs: np.ndarray) -> Any:
        if all(np.asarray(x).dtype == np.bool_ for x in xs):
            return bool_fn(*xs)
        return fn(*xs)

    # what float operands go through (see float_ufunc)
    f.ufunc = fn  # type: ignore[attr-defined]
    return f


def float_ufunc(op: Op) -> Optional[Any]:
    """The numpy ufunc that is ``op``'s reference on float32 operands (ELEMENTWISE[op].numpy
    computes exactly it for them), or None: the interpreter calls it with ``out=`` a dead
    operand's buffer instead of allocating a new array."""
    fn = ELEMENTWISE[op].numpy
    if op is Op.ERF:
        try:
            from scipy.special import erf
        except ImportError:
            return None
        return erf
    if isinstance(fn, np.ufunc):
        return fn
    return getattr(fn, "ufunc", None)


# --- derivatives of the elementwise ops (fusec.autodiff) ------------------------------------------
# deriv(b, ins, out, g, i) -> g * d(out)/d(ins[i]), or None where that derivative is zero (or the
# input is not differentiable). b is the current trace's Builder; ins are tracers or, for literal
# operands, Python scalars; out is the op's result; g is a cotangent (reverse mode) or a tangent
# of ins[i] (forward mode): an elementwise derivative is the same product in both modes. The
# products broadcast: reverse mode sums them back to the operand's shape.
# Rules use the tracers' Python operators (fusec.numpy attaches them) and b.bind for the rest.


def ad_atom(x: Any, dtype: str = "float32") -> Any:
    """A rule's operand as an IR atom: tracers as they are, Python scalars as float literals of
    ``dtype``."""
    from .ir import Lit as _Lit

    if isinstance(x, (bool, int, float)):
        with np.errstate(over="ignore"):
            return _Lit(float(np.float16(x)) if dtype == "float16" else float(x), dtype)
    return x


def ad_float(x: Any) -> str:
    """The float dtype of a rule's operand ``x`` (a Python scalar's: float32)."""
    dt = str(getattr(getattr(x, "var", None), "dtype", "float32"))
    return dt if dtypes.is_float(dt) else "float32"


def ad_call(b: Any, op: Op, *xs: Any, **params: Any) -> Any:
    """``op(*xs)`` bound in the current trace (for rules: functions that have no operator).
    Python scalars take the float dtype of the traced operands (float16 stays float16)."""
    fdt = next((str(x.var.dtype) for x in xs if hasattr(x, "var")
                and dtypes.is_float(str(x.var.dtype))), "float32")
    return b.bind(op, [ad_atom(x, fdt) for x in xs], params)


def _d_scale(f: Callable[[Any, Any, Any], Any]) -> Callable[..., Any]:
    """A unary op whose derivative is ``f(b, x, out)``: g * f."""
    return lambda b, ins, out, g, i: g * f(b, ins[0], out)


def _sq(x: Any) -> Any:
    return x * x


_D_NONE: Callable[..., Any] = lambda b, ins, out, g, i: None  # noqa: E731  (piecewise constant)
_D_ID: Callable[..., Any] = lambda b, ins, out, g, i: g  # noqa: E731
_D_NEG: Callable[..., Any] = lambda b, ins, out, g, i: -g  # noqa: E731
_D_ABS = _d_scale(lambda b, x, y: ad_call(b, Op.SIGN, x))
_D_EXP = _d_scale(lambda b, x, y: y)
_D_LOG = lambda b, ins, out, g, i: g / ins[0]  # noqa: E731
_D_SQRT = lambda b, ins, out, g, i: g * 0.5 / out  # noqa: E731
_D_RSQRT = lambda b, ins, out, g, i: g * (-0.5) * out / ins[0]  # noqa: E731
_D_TANH = _d_scale(lambda b, x, y: 1.0 - y * y)
_D_SIN = _d_scale(lambda b, x, y: ad_call(b, Op.COS, x))
_D_COS = lambda b, ins, out, g, i: -(g * ad_call(b, Op.SIN, ins[0]))  # noqa: E731
_D_ERF = _d_scale(lambda b, x, y: (2.0 / math.sqrt(math.pi)) * ad_call(b, Op.EXP, -(x * x)))
_D_LOG1P = lambda b, ins, out, g, i: g / (1.0 + ins[0])  # noqa: E731
_D_EXPM1 = _d_scale(lambda b, x, y: y + 1.0)
_D_LOG2 = lambda b, ins, out, g, i: g / (ins[0] * math.log(2.0))  # noqa: E731
_D_TAN = _d_scale(lambda b, x, y: 1.0 + y * y)
_D_SINH = _d_scale(lambda b, x, y: ad_call(b, Op.COSH, x))
_D_COSH = _d_scale(lambda b, x, y: ad_call(b, Op.SINH, x))
_D_ASIN = _d_scale(lambda b, x, y: ad_call(b, Op.RSQRT, 1.0 - x * x))
_D_ACOS = _d_scale(lambda b, x, y: -ad_call(b, Op.RSQRT, 1.0 - x * x))
_D_ATAN = lambda b, ins, out, g, i: g / (1.0 + ins[0] * ins[0])  # noqa: E731
_D_ASINH = _d_scale(lambda b, x, y: ad_call(b, Op.RSQRT, x * x + 1.0))
_D_ACOSH = _d_scale(lambda b, x, y: ad_call(b, Op.RSQRT, (x - 1.0) * (x + 1.0)))
_D_ATANH = lambda b, ins, out, g, i: g / (1.0 - ins[0] * ins[0])  # noqa: E731
_D_ADD = _D_ID
_D_SUB: Callable[..., Any] = lambda b, ins, out, g, i: g if i == 0 else -g  # noqa: E731
_D_MUL: Callable[..., Any] = lambda b, ins, out, g, i: g * ins[1 - i]  # noqa: E731
_D_DIV: Callable[..., Any] = (  # noqa: E731
    lambda b, ins, out, g, i: g / ins[1] if i == 0 else -(g * out) / ins[1])


def _d_pow(b: Any, ins: Sequence[Any], out: Any, g: Any, i: int) -> Any:
    x, y = ins
    if i == 0:  # y * x ** (y - 1); zero where y == 0 (also at x == 0, where x ** -1 is inf)
        d = y * (x ** (y - 1.0)) if not isinstance(y, (int, float)) else (
            y * x ** (y - 1.0) if y != 0 else None)
        if d is None:
            return None
        if not isinstance(y, (int, float)):
            d = ad_call(b, Op.WHERE, y == 0.0, 0.0, d)
        return g * d
    # log(x) * x ** y, with log(0) taken as 0: d/dy of 0 ** y is 0 for y > 0
    if isinstance(x, (int, float)):  # a literal base; log of a negative one is NaN, as log(x)
        return g * (math.log(x) if x > 0 else 0.0 if x == 0 else math.nan) * out
    safe = ad_call(b, Op.WHERE, x == 0.0, 1.0, x)
    return g * ad_call(b, Op.LOG, safe) * out


def _d_minmax(greater: bool) -> Callable[..., Any]:
    def d(b: Any, ins: Sequence[Any], out: Any, g: Any, i: int) -> Any:
        x, other = ins[i], ins[1 - i]
        wins = (x > other) if greater else (x < other)
        if isinstance(wins, bool):  # two literals: never differentiated
            return None
        # ties share the gradient equally, as JAX's max/min do
        half = ad_call(b, Op.WHERE, x == other, g * 0.5, 0.0)
        return ad_call(b, Op.WHERE, wins, g, half)

    return d


def _d_atan2(b: Any, ins: Sequence[Any], out: Any, g: Any, i: int) -> Any:
    y, x = ins  # arctan2(y, x)
    r = y * y + x * x
    return g * x / r if i == 0 else -(g * y) / r


def _d_copysign(b: Any, ins: Sequence[Any], out: Any, g: Any, i: int) -> Any:
    if i == 1:
        return None
    x, y = ins
    flip = ad_call(b, Op.NE, ad_call(b, Op.SIGNBIT, x), ad_call(b, Op.SIGNBIT, y))
    return ad_call(b, Op.WHERE, flip, -g, g)


def _d_rem(trunc: bool) -> Callable[..., Any]:
    # x - y * floor(x / y) (numpy's remainder) or x - y * trunc(x / y) (fmod)
    def d(b: Any, ins: Sequence[Any], out: Any, g: Any, i: int) -> Any:
        if i == 0:
            return g
        q = ad_call(b, Op.TRUNC if trunc else Op.FLOOR, ins[0] / ins[1])
        return -(g * q)

    return d


def _d_where(b: Any, ins: Sequence[Any], out: Any, g: Any, i: int) -> Any:
    if i == 0:
        return None
    if isinstance(ins[0], (bool, int, float)):  # a literal condition picks one branch statically
        # (ad_call would make it a float32 literal, which a select refuses)
        return g if bool(ins[0]) == (i == 1) else None
    # a select, not a product with a mask: a NaN cotangent must not leak into the other branch
    return ad_call(b, Op.WHERE, ins[0], g, 0.0) if i == 1 else ad_call(b, Op.WHERE, ins[0], 0.0, g)


_TRANSCENDENTAL = (2e-5, 1e-6)

ELEMENTWISE: dict[Op, Elementwise] = {
    e.op: e
    for e in [
        Elementwise(Op.STOP_GRADIENT, lambda x: x, lambda a, dt: a[0], tol=(0.0, 0.0),
                    deriv=_D_NONE),
        Elementwise(Op.NEG, np.negative, _neg, bool_ok=False, tol=(0.0, 0.0), deriv=_D_NEG),
        Elementwise(Op.ABS, np.abs, _abs, tol=(0.0, 0.0), deriv=_D_ABS),
        Elementwise(Op.EXP, np.exp, _call("fusec_exp"), float_only=True, tol=_TRANSCENDENTAL,
                    deriv=_D_EXP),
        Elementwise(Op.LOG, np.log, _call("fusec_log"), float_only=True, tol=_TRANSCENDENTAL,
                    deriv=_D_LOG),
        Elementwise(Op.SQRT, np.sqrt, _call("sqrt"), float_only=True, tol=(1e-6, 0.0),
                    deriv=_D_SQRT),
        Elementwise(Op.RSQRT, lambda x: (1 / np.sqrt(x)).astype(x.dtype), _call("inverseSqrt"),
                    float_only=True, tol=(1e-6, 0.0), deriv=_D_RSQRT),
        Elementwise(Op.TANH, np.tanh, _call("fusec_tanh"), float_only=True, tol=_TRANSCENDENTAL,
                    deriv=_D_TANH),
        # (fusec_sin_cos: WGSL promises the builtins only to 2^-11 absolute on [-pi, pi])
        Elementwise(Op.SIN, np.sin, _call("fusec_sin"), float_only=True, tol=(1e-5, 2e-6),
                    deriv=_D_SIN),
        Elementwise(Op.COS, np.cos, _call("fusec_cos"), float_only=True, tol=(1e-5, 2e-6),
                    deriv=_D_COS),
        Elementwise(Op.ERF, _np_erf, _call("fusec_erf"), float_only=True, tol=(1e-5, 1e-6),
                    deriv=_D_ERF),
        Elementwise(Op.ADD, _np_bool_safe(np.add, np.logical_or), _bin("+", "||"), tol=(1e-7, 0.0),
                    deriv=_D_ADD),
        Elementwise(Op.SUB, np.subtract, _bin("-"), bool_ok=False, tol=(1e-7, 0.0), deriv=_D_SUB),
        Elementwise(Op.MUL, _np_bool_safe(np.multiply, np.logical_and), _bin("*", "&&"),
                    tol=(1e-7, 0.0), deriv=_D_MUL),
        Elementwise(Op.DIV, np.divide, _div, float_only=True, tol=(1e-6, 0.0), deriv=_D_DIV),
        Elementwise(Op.POW, _np_power, _pow, bool_ok=False, tol=(5e-5, 1e-6), deriv=_d_pow),
        Elementwise(Op.MAX, np.maximum, _minmax(">", "max", "||"), tol=(0.0, 0.0),
                    deriv=_d_minmax(True)),
        Elementwise(Op.MIN, np.minimum, _minmax("<", "min", "&&"), tol=(0.0, 0.0),
                    deriv=_d_minmax(False)),
        # --- rounding, sign: exact
        Elementwise(Op.FLOOR, np.floor, _rounding("floor"), tol=(0.0, 0.0), deriv=_D_NONE),
        Elementwise(Op.CEIL, np.ceil, _rounding("ceil"), tol=(0.0, 0.0), deriv=_D_NONE),
        Elementwise(Op.TRUNC, np.trunc, _rounding("trunc"), tol=(0.0, 0.0), deriv=_D_NONE),
        # WGSL's round is half to even, as numpy's (np.round is np.rint for decimals=0)
        Elementwise(Op.ROUND, _np_round, _rounding("round"), bool_ok=False, tol=(0.0, 0.0),
                    deriv=_D_NONE),
        # sign(NaN) = NaN, sign(+-0) = +0, as numpy
        Elementwise(Op.SIGN, np.sign, _by_dtype(
            "select(select(select(0.0, -1.0, {0} < 0.0), 1.0, {0} > 0.0), {0}, fusec_isnan({0}))",
            "select(select(0i, -1i, {0} < 0i), 1i, {0} > 0i)", "select(0u, 1u, {0} != 0u)"),
            bool_ok=False, tol=(0.0, 0.0), deriv=_D_NONE),
        Elementwise(Op.SIGNBIT, np.signbit, _by_dtype(
            "((bitcast<u32>({0}) & 0x80000000u) != 0u)", "({0} < 0i)", "false", "false"),
            tol=(0.0, 0.0)),
        Elementwise(Op.COPYSIGN, np.copysign, _call("fusec_copysign"), float_only=True,
                    tol=(0.0, 0.0), deriv=_d_copysign),
        # --- predicates on the bits (x != x may be folded away by compilers that assume no NaN)
        Elementwise(Op.ISNAN, _np_isnan, _by_dtype("fusec_isnan({0})", "false", "false", "false"),
                    tol=(0.0, 0.0)),
        Elementwise(Op.ISINF, _np_isinf, _by_dtype("fusec_isinf({0})", "false", "false", "false"),
                    tol=(0.0, 0.0)),
        Elementwise(Op.ISFINITE, _np_isfinite,
                    _by_dtype("fusec_isfinite({0})", "true", "true", "true"), tol=(0.0, 0.0)),
        # --- logarithms and exponentials (the helpers above). Measured on lavapipe against
        # float64 over 1e-30..1e30: log1p 1.9e-7 relative, log2 1.6e-7 (3 ULP: the core
        # log(1 + f), a few roundings and one division). Held to 1e-6 (17 ULP), which leaves room
        # for a GPU's division (WGSL: 2.5 ULP) and sqrt. expm1 is a series below 0.5 (measured
        # 1.2e-7 near 0, 3.5e-7 at 0.5) and exp(x) - 1 beyond, so it carries exp's bound
        # (3 + 2|x| ULP in WGSL).
        Elementwise(Op.LOG1P, np.log1p, _call("fusec_log1p"), float_only=True, tol=(1e-6, 0.0),
                    deriv=_D_LOG1P),
        Elementwise(Op.LOG2, np.log2, _call("fusec_log2"), float_only=True, tol=(1e-6, 0.0),
                    deriv=_D_LOG2),
        Elementwise(Op.EXPM1, np.expm1, _call("fusec_expm1"), float_only=True,
                    tol=_TRANSCENDENTAL, deriv=_D_EXPM1),
        # sinh and cosh are products of exp (3 + 2|x| ULP in WGSL): exp's tolerance
        Elementwise(Op.SINH, np.sinh, _call("fusec_sinh"), float_only=True, tol=_TRANSCENDENTAL,
                    deriv=_D_SINH),
        Elementwise(Op.COSH, np.cosh, _call("fusec_cosh"), float_only=True, tol=_TRANSCENDENTAL,
                    deriv=_D_COSH),
        # WGSL's tan is sin / cos: the accuracy of sin and cos (lavapipe measured 1.8e-7 relative
        # on [-1.5, 1.5]); near pi/2 the division magnifies cos's absolute error
        Elementwise(Op.TAN, np.tan, _call("fusec_tan"), float_only=True, tol=(1e-5, 2e-6),
                    deriv=_D_TAN),
        # atan and atan2: the series and range reduction of fusec_atan01 (measured 1.8e-7 and
        # 2.1e-7 relative); asin/acos add a sqrt (2.5e-7, 2.8e-7), the inverse hyperbolic
        # functions go through log1p (asinh 2.0e-7, acosh 2.3e-7, atanh 2.2e-7). Held to 1e-6 (17
        # ULP) for a GPU's division and sqrt, as log1p.
        Elementwise(Op.ATAN, np.arctan, _call("fusec_atan"), float_only=True, tol=(1e-6, 0.0),
                    deriv=_D_ATAN),
        Elementwise(Op.ATAN2, np.arctan2, _call("fusec_atan2"), float_only=True,
                    tol=(1e-6, 0.0), deriv=_d_atan2),
        Elementwise(Op.ASIN, np.arcsin, _call("fusec_asin"), float_only=True, tol=(1e-6, 0.0),
                    deriv=_D_ASIN),
        Elementwise(Op.ACOS, np.arccos, _call("fusec_acos"), float_only=True, tol=(1e-6, 0.0),
                    deriv=_D_ACOS),
        Elementwise(Op.ASINH, np.arcsinh, _call("fusec_asinh"), float_only=True,
                    tol=(1e-6, 0.0), deriv=_D_ASINH),
        Elementwise(Op.ACOSH, np.arccosh, _call("fusec_acosh"), float_only=True,
                    tol=(1e-6, 0.0), deriv=_D_ACOSH),
        Elementwise(Op.ATANH, np.arctanh, _call("fusec_atanh"), float_only=True,
                    tol=(1e-6, 0.0), deriv=_D_ATANH),
        # --- division and remainders: fmod is exact (fusec_fmod works on the integer
        # significands); remainder is fmod plus, where the signs differ, y: one rounding
        # (0.5 ULP) when |x| < |y|; floor_divide is an integer-valued float, exact unless the
        # quotient passes 2^22, where the division's rounding may move it by one unit
        Elementwise(Op.REM, np.remainder, _by_dtype(
            "fusec_rem({0}, {1})", "fusec_rem_i32({0}, {1})", "({0} % max({1}, 1u))"),
            bool_ok=False, tol=(2**-24, 0.0), deriv=_d_rem(False)),
        Elementwise(Op.FMOD, np.fmod, _by_dtype(
            "fusec_fmod({0}, {1})", "fusec_fmod_i32({0}, {1})", "({0} % max({1}, 1u))"),
            bool_ok=False, tol=(0.0, 0.0), deriv=_d_rem(True)),
        Elementwise(Op.FLOORDIV, np.floor_divide, _by_dtype(
            "fusec_floordiv({0}, {1})", "fusec_floordiv_i32({0}, {1})",
            "select({0} / max({1}, 1u), 0u, {1} == 0u)"), bool_ok=False, tol=(1e-6, 0.0),
                    deriv=_D_NONE),
        # --- bitwise (logical on bools; fusec.numpy refuses floats)
        Elementwise(Op.AND, np.bitwise_and, _by_dtype(
            None, "({0} & {1})", "({0} & {1})", "({0} & {1})"), tol=(0.0, 0.0)),
        Elementwise(Op.OR, np.bitwise_or, _by_dtype(
            None, "({0} | {1})", "({0} | {1})", "({0} | {1})"), tol=(0.0, 0.0)),
        Elementwise(Op.XOR, np.bitwise_xor, _by_dtype(
            None, "({0} ^ {1})", "({0} ^ {1})", "({0} != {1})"), tol=(0.0, 0.0)),
        Elementwise(Op.NOT, np.invert, _by_dtype(None, "(~{0})", "(~{0})", "(!{0})"),
                    tol=(0.0, 0.0)),
        Elementwise(Op.SHL, np.left_shift, _shift(left=True), bool_ok=False, tol=(0.0, 0.0)),
        Elementwise(Op.SHR, np.right_shift, _shift(left=False), bool_ok=False, tol=(0.0, 0.0)),
        Elementwise(Op.GT, np.greater, _bin(">"), tol=(0.0, 0.0)),
        Elementwise(Op.GE, np.greater_equal, _bin(">="), tol=(0.0, 0.0)),
        Elementwise(Op.LT, np.less, _bin("<"), tol=(0.0, 0.0)),
        Elementwise(Op.LE, np.less_equal, _bin("<="), tol=(0.0, 0.0)),
        Elementwise(Op.EQ, np.equal, _bin("=="), tol=(0.0, 0.0)),
        # naga emits an ordered != (false when an operand is NaN; numpy says true): NaN is
        # tested on the bits
        Elementwise(Op.NE, np.not_equal, _by_dtype(
            "(fusec_isnan({0}) || fusec_isnan({1}) || {0} != {1})", "({0} != {1})",
            "({0} != {1})", "({0} != {1})"), tol=(0.0, 0.0)),
        # where(c, a, b): WGSL select(false_value, true_value, cond)
        Elementwise(Op.WHERE, np.where, lambda a, dt: f"select({a[2]}, {a[1]}, {a[0]})",
                    tol=(0.0, 0.0), deriv=_d_where),
    ]
}


def cast_wgsl(expr: str, src: str, dst: str) -> str:
    """WGSL for numpy's astype between supported dtypes. float16 values are computed as f32: a
    cast from float16 is one from float32, and a cast to float16 rounds the f32 to the nearest
    f16 value (``fusec_round_f16``)."""
    if src == dst:
        return expr
    if dst == "float16":
        return f"fusec_round_f16({cast_wgsl(expr, src, 'float32')})"
    src = dtypes.compute_dtype(src)
    if src == dst:
        return expr
    ty = dtypes.WGSL_TYPE[dst]
    if dst == "bool":
        if src == "float32":  # NaN is true: on the bits, as x != 0.0 is false for NaN (see NE)
            return f"((bitcast<u32>({expr}) & 0x7fffffffu) != 0u)"
        return f"({expr} != {'0i' if src == 'int32' else '0u'})"
    if src == "bool":
        one, zero = {"float32": ("1.0", "0.0"), "int32": ("1i", "0i"), "uint32": ("1u", "0u")}[dst]
        return f"select({zero}, {one}, {expr})"
    return f"{ty}({expr})"  # i32<->u32 reinterpret the bits; float->int saturates


def ipow_wgsl(expr: str, n: int, dtype: str) -> str:
    """x ** n for a Python int n, by repeated multiplication (exact for integers, as numpy)."""
    if n == 0:
        return wgsl_literal(1, dtype)
    m = abs(n)
    parts = [expr] * m
    prod = "(" + " * ".join(parts) + ")"
    return f"(1.0 / {prod})" if n < 0 else prod


def elementwise_dtype(op: Op, in_dtypes: Sequence[str], params: dict[str, Any]) -> str:
    if op in PREDICATE:
        return "bool"
    if op is Op.CAST:
        return str(params["dtype"])
    if op is Op.WHERE:
        return in_dtypes[1]
    return in_dtypes[0]


def numpy_elementwise(op: Op, args: Sequence[np.ndarray], params: dict[str, Any],
                      out_dtype: str) -> np.ndarray:
    """The numpy reference of an elementwise primitive, computed in the operand dtype."""
    ndt = np.dtype(out_dtype)
    if op is Op.CAST:
        x = args[0]
        if out_dtype == "bool":
            return np.asarray(x != 0)
        with np.errstate(all="ignore"):  # (to float16 beyond its range: inf, as on the GPU)
            return np.asarray(x).astype(ndt)
    if op is Op.IPOW:
        n = int(params["n"])
        with np.errstate(all="ignore"):
            x = args[0]
            if n < 0:
                return np.asarray(1 / np.power(x, -n)).astype(ndt)
            return np.asarray(np.power(x, n)).astype(ndt)
    with np.errstate(all="ignore"):
        out = ELEMENTWISE[op].numpy(*args)
    return np.asarray(out).astype(ndt, copy=False)


# --- reductions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reduction:
    op: Op
    numpy: Callable[..., Any]  # (array, axis=tuple) -> array, computed in the array's dtype
    combine: Callable[[str, str, str], str]  # (accumulator, value, dtype) -> WGSL expression
    identity: Callable[[str], Any]  # dtype -> Python value


def _max_identity(dt: str) -> Any:
    return {"float32": -math.inf, "float16": -math.inf, "int32": -(2**31), "uint32": 0,
            "bool": False}[dt]


def _min_identity(dt: str) -> Any:
    return {"float32": math.inf, "float16": math.inf, "int32": 2**31 - 1, "uint32": 2**32 - 1,
            "bool": True}[dt]


# The float32 combines of reduce_max and reduce_min are the helpers fusec_max_f32 and
# fusec_min_f32 (see HELPERS), so every strategy that combines through the table (row kernels, a
# thread per output, partial stages and their trees) propagates NaN as numpy does. A NaN operand is
# returned as it is (numpy keeps the first NaN's bits; which NaN comes out here depends on the
# order of the combines).
def _minmax_combine(name: str) -> Callable[[str, str, str], str]:
    def f(a: str, b: str, dt: str) -> str:
        dt = dtypes.compute_dtype(dt)
        if dt in ("float32", "int32"):
            return f"fusec_{name}_{dt[0]}32({a}, {b})"
        return f"{name}({a}, {b})"

    return f


def _np_reduce(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` computed in the operand's own dtype (int32 products and sums wrap around modulo
    2^32, as on the GPU)."""
    def f(x: np.ndarray, axis: Any = None) -> Any:
        with np.errstate(all="ignore"):
            return fn(x, axis=axis, dtype=x.dtype)

    return f


REDUCTIONS: dict[Op, Reduction] = {
    Op.SUM: Reduction(Op.SUM, _np_reduce(np.sum), lambda a, b, dt: f"({a} + {b})",
                      lambda dt: 0),
    Op.RMAX: Reduction(Op.RMAX, np.max, _minmax_combine("max"), _max_identity),
    Op.RMIN: Reduction(Op.RMIN, np.min, _minmax_combine("min"), _min_identity),
    # bool products are computed as int32 (fusec.numpy.prod casts first), as numpy does
    Op.PROD: Reduction(Op.PROD, _np_reduce(np.prod), lambda a, b, dt: f"({a} * {b})",
                       lambda dt: 1),
}


def partial_numpy(x: np.ndarray, op: Op, axes: tuple[int, ...], chunks: int) -> np.ndarray:
    """Reference of ``reduce_partial``: chunk g of the flattened reduced axes, reduced."""
    kept = [k for k in range(x.ndim) if k not in axes]
    moved = np.transpose(x, kept + list(axes))
    outer = tuple(x.shape[k] for k in kept)
    r = int(np.prod([x.shape[k] for k in axes], dtype=np.int64))
    flat = moved.reshape(outer + (r,))
    size = -(-r // chunks)
    ident = REDUCTIONS[op].identity(x.dtype.name)
    padded = np.full(outer + (size * chunks,), ident, dtype=x.dtype)
    padded[..., :r] = flat
    return np.asarray(REDUCTIONS[op].numpy(padded.reshape(outer + (chunks, size)), axis=-1),
                      dtype=x.dtype)


def slice_shape(shape: Shape, starts: tuple[int, ...], steps: tuple[int, ...],
                out: Shape) -> Shape:
    """Check a static slice: out[o] = x[start + o * step] stays inside ``shape`` on every axis."""
    if not len(shape) == len(starts) == len(steps) == len(out):
        raise ShapeError(f"slice of shape {shape}: starts {starts}, steps {steps} and result "
                         f"shape {out} must have one entry per axis")
    for d, s0, st, n in zip(shape, starts, steps, out):
        if st == 0 or n < 0:
            raise ShapeError(f"slice step must be non-zero; got steps {steps}")
        if n and not (0 <= s0 < d and 0 <= s0 + (n - 1) * st < d):
            raise ShapeError(f"slice starts {starts}, steps {steps}, shape {out} leave the bounds "
                             f"of shape {shape}")
    return tuple(out)


# Facts of ops that live in sections of their own (scatter, scan, sort, ...): the type rule
# ((shape, dtype) per input, params) -> (shape, dtype), and the numpy reference
# (input arrays, params, (shape, dtype) of the result) -> array. The interpreter and the verifier
# read these tables.
TYPE_RULES: dict[Op, Callable[[Sequence[tuple[Shape, str]], dict[str, Any]],
                              tuple[Shape, str]]] = {}
NUMPY_RULES: dict[Op, Callable[[Sequence[np.ndarray], dict[str, Any], tuple[Shape, str]],
                               np.ndarray]] = {}
# ops of several results (loops): (input types, params) -> one (shape, dtype) per result
MULTI_TYPE_RULES: dict[Op, Callable[[Sequence[tuple[Shape, str]], dict[str, Any]],
                                    list[tuple[Shape, str]]]] = {}


def _loop_types(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                ) -> list[tuple[Shape, str]]:
    """A loop's results are its carries: the types of its first ``carries`` inputs, which its
    body maps to themselves (fusec.control_flow checks that when it traces the body)."""
    body = params["body"]
    n = int(params["carries"])
    if len(in_types) != len(body.inputs) or any(
            (tuple(s), d) != (v.shape, v.dtype) for (s, d), v in zip(in_types, body.inputs)):
        raise ShapeError("loop: the inputs do not match its body's")
    if [(o.shape, o.dtype) for o in body.outputs] != [(tuple(s), d) for s, d in in_types[:n]]:
        raise ShapeError("loop: its body's results do not match its carries")
    return [(tuple(s), d) for s, d in in_types[:n]]


MULTI_TYPE_RULES[Op.LOOP] = _loop_types


# --- scan: cumulative sums, products, maxima and minima along an axis (fusec.passes.scan) ---------
# ``cumulative`` is numpy's ufunc.accumulate along the axis. Its stages (``scan_reduce``, ``scan``)
# add floats in another order than numpy does; their references here follow the order the GPU
# kernels use (fusec.kernels.scan), operation for operation in the array's own dtype, so the
# interpreter of a lowered program gives the GPU's float32 results bit for bit.

SCAN_REDUCES = ("sum", "prod", "max", "min")
_SCAN_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def scan_identity(reduce: str, dtype: str) -> Any:
    """The value that leaves anything unchanged under ``reduce`` in ``dtype``."""
    if reduce == "max":
        return _max_identity(dtype)
    if reduce == "min":
        return _min_identity(dtype)
    return {"sum": 0, "prod": 1}[reduce]


def _scan_checked(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any],
                  n_inputs: tuple[int, ...]) -> tuple[Shape, str, int]:
    """The operand's shape and dtype and the scanned axis, after checking the params."""
    from .errors import DTypeError

    if len(in_types) not in n_inputs:
        raise ShapeError(f"scan op takes {' or '.join(map(str, n_inputs))} operand(s); "
                         f"got {len(in_types)}")
    shape, dt = in_types[0]
    reduce, axis = params.get("reduce"), params.get("axis")
    if reduce not in SCAN_REDUCES:
        raise ValueError(f"scan reduce must be one of {SCAN_REDUCES}; got {reduce!r}")
    if dt == "bool" and reduce in ("sum", "prod"):
        raise DTypeError(f"a scan's {reduce} of bool is not defined: scan int32 (numpy's "
                         "cumsum does), or max/min for logical or/and")
    if not isinstance(axis, int) or not 0 <= axis < len(shape):
        raise ShapeError(f"scan axis {axis!r} is out of range for shape {shape}")
    return shape, dt, axis


def _scan_layout_checked(params: dict[str, Any]) -> int:
    """Positions per chunk; for the "tile" layout, check that chunks are whole tiles."""
    chunk = int(params["chunk"])
    if chunk < 1:
        raise ValueError(f"scan chunk must be positive; got {chunk}")
    if params["layout"] == "tile":
        threads, rounds = int(params["threads"]), int(params["rounds"])
        if threads < 1 or threads & (threads - 1) or rounds < 1 or chunk % (4 * threads * rounds):
            raise ValueError(f"a tile scan needs threads a power of two and chunks of whole tiles "
                             f"(4 x threads x rounds); got {params}")
    elif params["layout"] != "serial":
        raise ValueError(f"scan layout must be tile or serial; got {params['layout']!r}")
    return chunk


def _chunked_shape(shape: Shape, axis: int, chunk: int) -> Shape:
    return shape[:axis] + (-(-shape[axis] // chunk),) + shape[axis + 1:]


def _cumulative_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                     ) -> tuple[Shape, str]:
    shape, dt, _ = _scan_checked(in_types, params, (1,))
    return shape, dt


def _scan_reduce_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                      ) -> tuple[Shape, str]:
    shape, dt, axis = _scan_checked(in_types, params, (1,))
    return _chunked_shape(shape, axis, _scan_layout_checked(params)), dt


def _scan_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
               ) -> tuple[Shape, str]:
    shape, dt, axis = _scan_checked(in_types, params, (1, 2))
    chunk = _scan_layout_checked(params)
    if len(in_types) == 2 and in_types[1] != (_chunked_shape(shape, axis, chunk), dt):
        raise ShapeError(f"scan carries must be {dt}{_chunked_shape(shape, axis, chunk)} for "
                         f"{dt}{shape} in chunks of {chunk}; got {in_types[1][1]}{in_types[1][0]}")
    return shape, dt


def _scan_rows(x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """x as rows (every other coordinate, in C order) of its positions along ``axis`` in scan
    order."""
    m = np.moveaxis(x, axis, -1)
    rows = m.reshape(math.prod(m.shape[:-1]), m.shape[-1])
    return rows[:, ::-1] if reverse else rows


def _scan_unrows(rows: np.ndarray, shape: Shape, axis: int, reverse: bool) -> np.ndarray:
    if reverse:
        rows = rows[:, ::-1]
    moved = shape[:axis] + shape[axis + 1:] + (shape[axis],)
    return np.ascontiguousarray(np.moveaxis(rows.reshape(moved), -1, axis))


def cumulative_numpy(x: np.ndarray, reduce: str, axis: int, reverse: bool = False) -> np.ndarray:
    """Reference of ``cumulative``: numpy's accumulate along ``axis`` in x's dtype (integers wrap
    around; float16 sums and products accumulate in float32, as on the GPU), from the end when
    ``reverse``."""
    rows = _scan_rows(x, axis, reverse)
    if x.dtype == np.float16 and reduce in ("sum", "prod"):
        rows = rows.astype(np.float32)
    with np.errstate(all="ignore"):
        out = _SCAN_UFUNC[reduce].accumulate(rows, axis=-1) if rows.size else rows
        out = np.asarray(out, dtype=x.dtype)
    return _scan_unrows(out, x.shape, axis, reverse)


def _scan_chunks(x: np.ndarray, p: dict[str, Any]) -> tuple[np.ndarray, int, int]:
    """x's rows cut into chunks, padded with the identity: (rows, chunks, chunk), n, chunks."""
    rows = _scan_rows(x, int(p["axis"]), bool(p["reverse"]))
    n, chunk = rows.shape[1], int(p["chunk"])
    chunks = -(-n // chunk)
    padded = np.full((rows.shape[0], chunks * chunk), scan_identity(p["reduce"], x.dtype.name),
                     dtype=x.dtype)
    padded[:, :n] = rows
    return padded.reshape(rows.shape[0], chunks, chunk), n, chunks


def _tile_total(op: Any, lanes: np.ndarray) -> np.ndarray:
    """A thread's 4 lane values combined as (l0 op l1) op (l2 op l3)."""
    return op(op(lanes[..., 0], lanes[..., 1]), op(lanes[..., 2], lanes[..., 3]))


def scan_reduce_numpy(x: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    """Reference of ``scan_reduce``. "serial": a thread folds its chunk from the identity, one
    position after another. "tile": ``threads`` threads share a chunk of rounds x threads x 4
    positions, position (k * threads + t) * 4 + lane going to thread t's accumulator ``lane``
    in round k; each thread's 4 accumulators combine as (0 op 1) op (2 op 3), then the threads'
    totals in a tree (thread t takes t + s's, s = threads / 2, ..., 1). Positions past the end
    of the row count as the identity."""
    op = _SCAN_UFUNC[p["reduce"]]
    xc, n, chunks = _scan_chunks(x, p)
    ident = scan_identity(p["reduce"], x.dtype.name)
    with np.errstate(all="ignore"):
        if p["layout"] == "serial":
            start = np.full(xc.shape[:2] + (1,), ident, dtype=x.dtype)
            acc = op.accumulate(np.concatenate([start, xc], axis=-1), axis=-1)
            last = np.minimum(int(p["chunk"]), n - np.arange(chunks) * int(p["chunk"]))
            red = np.take_along_axis(acc, np.broadcast_to(last[None, :, None],
                                                          acc.shape[:2] + (1,)), axis=-1)[..., 0]
        else:
            threads, rounds = int(p["threads"]), int(p["rounds"])
            parts = xc.reshape(xc.shape[:2] + (rounds, threads, 4))
            lanes = np.full(xc.shape[:2] + (threads, 4), ident, dtype=x.dtype)
            for k in range(rounds):
                lanes = op(lanes, parts[:, :, k])
            tot = _tile_total(op, lanes)
            s = threads // 2
            while s >= 1:
                tot[..., :s] = op(tot[..., :s], tot[..., s:2 * s])
                s //= 2
            red = tot[..., 0]
    shape = _chunked_shape(x.shape, int(p["axis"]), int(p["chunk"]))
    return _scan_unrows(np.asarray(red, dtype=x.dtype), shape, int(p["axis"]), False)


def scan_numpy(x: np.ndarray, carries: np.ndarray | None, p: dict[str, Any]) -> np.ndarray:
    """Reference of ``scan``: chunk g of each row starts from carries[g - 1] (the identity for
    g = 0 or without carries). "serial": a thread folds its chunk position after position.
    "tile": ``threads`` threads scan a chunk one tile (rounds x threads x 4 positions) after
    another, position (k * threads + t) * 4 + lane of a tile being thread t's lane ``lane`` in
    round k. A thread scans its 4 lanes (l0, l0 op l1, ...); the threads' last lanes are scanned
    across the threads in log2(threads) steps (Kogge-Stone: s[t] = s[t - d] op s[t] for t >= d,
    d = 1, 2, 4, ...), per round. With r the carry, for each round k: thread t's lanes become
    (r op s[t - 1]) op lane (the identity for s[-1]), then r = r op s[threads - 1]. The r after
    the last round carries into the next tile."""
    op = _SCAN_UFUNC[p["reduce"]]
    axis, reverse, chunk = int(p["axis"]), bool(p["reverse"]), int(p["chunk"])
    xc, n, chunks = _scan_chunks(x, p)
    ident = scan_identity(p["reduce"], x.dtype.name)
    carry = np.full(xc.shape[:2], ident, dtype=x.dtype)
    if carries is not None and chunks > 1:
        carry[:, 1:] = _scan_rows(carries, axis, False)[:, :-1]
    with np.errstate(all="ignore"):
        if p["layout"] == "serial":
            out = op.accumulate(np.concatenate([carry[..., None], xc], axis=-1), axis=-1)[..., 1:]
        else:
            threads, rounds = int(p["threads"]), int(p["rounds"])
            tile = 4 * threads * rounds
            parts = xc.reshape(xc.shape[:2] + (chunk // tile, rounds, threads, 4))
            out = np.empty_like(parts)
            for j in range(chunk // tile):
                lanes = op.accumulate(parts[:, :, j], axis=-1)
                s = lanes[..., 3].copy()  # (rows, chunks, rounds, threads)
                d = 1
                while d < threads:
                    s[..., d:] = op(s[..., :-d], s[..., d:])  # numpy reads before it writes
                    d *= 2
                before = np.full(s.shape, ident, dtype=x.dtype)
                before[..., 1:] = s[..., :-1]
                for k in range(rounds):
                    pre = op(carry[..., None], before[:, :, k])
                    out[:, :, j, k] = op(pre[..., None], lanes[:, :, k])
                    carry = op(carry, s[:, :, k, threads - 1])
    rows = np.asarray(out, dtype=x.dtype).reshape(xc.shape[0], chunks * chunk)[:, :n]
    return _scan_unrows(rows, x.shape, axis, reverse)


TYPE_RULES[Op.CUMULATIVE] = _cumulative_type
TYPE_RULES[Op.SCAN_REDUCE] = _scan_reduce_type
TYPE_RULES[Op.SCAN] = _scan_type
NUMPY_RULES[Op.CUMULATIVE] = lambda a, p, t: cumulative_numpy(
    a[0], p["reduce"], int(p["axis"]), bool(p.get("reverse", False)))
NUMPY_RULES[Op.SCAN_REDUCE] = lambda a, p, t: scan_reduce_numpy(a[0], p)
NUMPY_RULES[Op.SCAN] = lambda a, p, t: scan_numpy(a[0], a[1] if len(a) > 1 else None, p)
# --- scatter (fusec.numpy.scatter, fusec.passes.scatter, fusec.kernels.scatter) -----------------

SCATTER_MODES = ("set", "add", "multiply", "min", "max")
_SCATTER_UFUNCS = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}


def scatter_shape(target: Shape, types: Sequence[tuple[Shape, str]], what: str) -> Shape:
    """Check a scatter's updates and index arrays (``types``: updates first) against the array
    of shape ``target`` they go into; returns S, the shape they broadcast to. The user-facing
    function (fusec.numpy.scatter) has already cast the updates and checked the indices with
    messages naming the arguments; this is the IR's rule."""
    if len(types) != 1 + len(target):
        raise ShapeError(f"{what} into an array of {len(target)} axes needs as many index arrays; "
                         f"got {len(types) - 1}")
    if any(d not in ("int32", "uint32") for _, d in types[1:]):
        raise ShapeError(f"{what} indices must be int32 or uint32; "
                         f"got {[d for _, d in types[1:]]}")
    return broadcast_shapes(*(s for s, _ in types))


def _scatter_mode(params: dict[str, Any]) -> str:
    mode = str(params["mode"])
    if mode not in SCATTER_MODES:
        raise ValueError(f"scatter mode must be one of {SCATTER_MODES}; got {mode!r}")
    return mode


def _scatter_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                  ) -> tuple[Shape, str]:
    """scatter and scatter_into: inputs target, updates, i_0 ..; the result is the target's."""
    _scatter_mode(params)
    (shape, dt), (_, udt) = in_types[0], in_types[1]
    if udt != dt:
        raise ShapeError(f"scatter updates must have the operand's dtype {dt}; got {udt}")
    scatter_shape(shape, in_types[1:], "scatter")
    return shape, dt


def _scatter_add_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                      ) -> tuple[Shape, str]:
    """scatter_add: inputs updates, i_0 ..; params shape: zeros of it, of the updates' dtype."""
    shape = tuple(params["shape"])
    scatter_shape(shape, in_types, "scatter_add")
    return shape, in_types[0][1]


def scatter_numpy(operand: np.ndarray, updates: np.ndarray, indices: Sequence[np.ndarray],
                  mode: str) -> np.ndarray:
    """Reference of ``scatter``: a copy of ``operand`` with ``updates`` combined in at
    ``indices`` by numpy's unbuffered ``ufunc.at`` (duplicates accumulate in order); "set"
    assigns (numpy: the last duplicate wins; the GPU may keep any of them). A negative index
    counts from the end; indices still outside their axis are dropped."""
    if operand.dtype == np.float16 and mode != "set":  # combined in float32, as on the GPU
        out32 = scatter_numpy(operand.astype(np.float32), updates.astype(np.float32), indices,
                              mode)
        with np.errstate(over="ignore"):
            return out32.astype(np.float16)
    out = np.array(operand, copy=True, order="C")
    shape = np.broadcast_shapes(updates.shape, *(i.shape for i in indices))
    if out.size == 0 or math.prod(shape) == 0:
        return out
    u = np.broadcast_to(updates, shape).reshape(-1)
    keep = np.ones(u.shape, dtype=bool)
    flat = np.zeros(u.shape, dtype=np.int64)
    for i, d in zip(indices, operand.shape):
        k = np.broadcast_to(i, shape).reshape(-1).astype(np.int64)
        if i.dtype.kind == "i":
            k = np.where(k < 0, k + d, k)
        keep &= (k >= 0) & (k < d)
        flat = flat * d + k
    view = out.reshape(-1)  # a view: out is a fresh C-ordered copy
    if mode == "set":
        view[flat[keep]] = u[keep]
    else:
        with np.errstate(all="ignore"):
            _SCATTER_UFUNCS[mode].at(view, flat[keep], u[keep])
    return out


def _scatter_rule(args: Sequence[np.ndarray], params: dict[str, Any],
                  out: tuple[Shape, str]) -> np.ndarray:
    return scatter_numpy(args[0], args[1], args[2:], _scatter_mode(params))


def _scatter_add_rule(args: Sequence[np.ndarray], params: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    # exactly np.add.at into zeros: the GPU adds the same values in another order (floats round
    # differently; integers wrap to the same result)
    return scatter_numpy(np.zeros(out[0], dtype=out[1]), args[0], args[1:], "add")


TYPE_RULES[Op.SCATTER] = _scatter_type
TYPE_RULES[Op.SCATTER_INTO] = _scatter_type
TYPE_RULES[Op.SCATTER_ADD] = _scatter_add_type
NUMPY_RULES[Op.SCATTER] = _scatter_rule
NUMPY_RULES[Op.SCATTER_INTO] = _scatter_rule
NUMPY_RULES[Op.SCATTER_ADD] = _scatter_add_rule
# --- sort: argsort and sort, the stages they are lowered into, searchsorted -----------------------
# Sorting compares order keys: uint32 words whose unsigned order is the order numpy sorts values
# in. float32: positive values get the sign bit set, negative ones are inverted (so more negative
# is smaller); -0.0 takes the key of 0.0 (they compare equal, ties keep input order) and every NaN
# takes 0xFFFFFFFF (after +inf, in input order, as numpy and JAX sort them). int32: the sign bit
# flipped. uint32: itself. bool: 0 or 1. A descending order inverts every key.
#
# The stages carry (key, payload) pairs in a "state" uint32[2, rows, n]: plane 0 the keys, plane 1
# the payloads, which are the elements' positions in their row (argsort) or, with params
# values=True, the elements' own words (sort: every value keeps its bits, -0.0 and NaN payloads
# included). The last stage writes the payloads alone: int32 indices, or the values in the
# sorted array's dtype (param dtype).
#
# A radix sort of values (GPUs) carries the keys alone (params planes=1: a state uint32[1, rows,
# n], half the memory traffic) and its last pass writes each key's value (sort_value_words). A
# key gives back its value's bits, except that every zero has one key and every NaN one key
# (-0.0 equal to 0.0, NaNs last): a float sort then ends with two stages that put the original
# words of the zeros and of the NaNs, in input order, over the runs those keys fill
# (sort_specials counts them per block; sort_fixup moves them). Where a row holds neither, both
# stages stop at once.

SORT_RADIX_BITS = 8  # bits of the key each radix pass sorts by
SORT_DIGITS = 1 << SORT_RADIX_BITS


def sort_keys(x: np.ndarray, descending: bool = False) -> np.ndarray:
    """The uint32 order keys of ``x`` (see above)."""
    x = np.asarray(x)
    if x.dtype == np.float16:  # float32 holds every float16: the same order
        x = x.astype(np.float32)
    if x.dtype == np.bool_:
        k = x.astype(np.uint32)
    elif x.dtype == np.float32:
        b = x.view(np.uint32)
        mag = b & np.uint32(0x7FFFFFFF)
        k = np.where(b >> np.uint32(31) != 0, ~b, b | np.uint32(0x80000000))
        k = np.where(mag == 0, np.uint32(0x80000000), k)
        k = np.where(mag > np.uint32(0x7F800000), np.uint32(0xFFFFFFFF), k)
    elif x.dtype == np.int32:
        k = x.view(np.uint32) ^ np.uint32(0x80000000)
    else:
        k = x.astype(np.uint32)
    k = np.asarray(k, dtype=np.uint32)
    return ~k if descending else k


def sort_value_words(keys: np.ndarray, dtype: str, descending: bool = False) -> np.ndarray:
    """The words of the values whose order keys are ``keys`` (the inverse of sort_keys, where
    one exists): a zero's key gives +0.0, a NaN's the NaN 0x7fffffff."""
    k = np.asarray(keys, dtype=np.uint32)
    if descending:
        k = ~k
    if dtype == "float32":
        return np.where(k >> np.uint32(31) != 0, k ^ np.uint32(0x80000000), ~k).astype(np.uint32)
    if dtype == "int32":
        return k ^ np.uint32(0x80000000)
    return k


def sort_special_keys(descending: bool = False) -> tuple[int, int]:
    """The order keys of float32 zeros and NaNs (see sort_keys)."""
    zero, nan = 0x80000000, 0xFFFFFFFF
    return (zero ^ 0xFFFFFFFF, nan ^ 0xFFFFFFFF) if descending else (zero, nan)


def sort_key_bits(dtype: str) -> int:
    """How many low bits of a key can differ between elements (bool: only the lowest)."""
    return 1 if dtype == "bool" else 32


def _words(x: np.ndarray) -> np.ndarray:
    """The uint32 words a GPU buffer holds for ``x`` (bool: 0 or 1)."""
    x = np.ascontiguousarray(x)
    return x.astype(np.uint32) if x.dtype == np.bool_ else x.view(np.uint32)


def _from_words(w: np.ndarray, dtype: str) -> np.ndarray:
    w = np.ascontiguousarray(w, dtype=np.uint32)
    return w != 0 if dtype == "bool" else w.view(np.dtype(dtype))


def _sorted_order(x: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    return np.argsort(sort_keys(x, bool(p.get("descending", False))), axis=-1, kind="stable")


def _argsort_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                   out: tuple[Shape, str]) -> np.ndarray:
    return _sorted_order(args[0], p).astype(np.int32)


def _sort_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                out: tuple[Shape, str]) -> np.ndarray:
    # numpy's own sort orders as the keys do (NaN last, -0 equal to 0) and is 3x faster than
    # ordering by the keys, but not stably: it may only run where elements of equal keys are
    # identical, which excludes -0 beside 0 and NaNs (their bits differ)
    x = args[0]
    if x.dtype in (np.int32, np.uint32) or x.dtype == np.float32 and not (
            (x == 0).any() or np.isnan(x).any()):
        s = np.sort(x, axis=-1)
        return np.flip(s, axis=-1) if p.get("descending", False) else s
    return np.take_along_axis(x, _sorted_order(x, p), axis=-1)


def _sort_type(values: bool) -> Callable[[Sequence[tuple[Shape, str]], dict[str, Any]],
                                         tuple[Shape, str]]:
    def rule(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
        shape, dt = ins[0]
        if len(shape) < 1:
            raise ShapeError("sorts run along the last axis; a 0-d array has none")
        if 2 * math.prod(shape) >= 2**32:
            raise ShapeError(f"cannot sort {math.prod(shape)} elements (shape {shape}): the "
                             "sort's keys and indices must fit 2^32 words")
        return shape, (dt if values else "int32")

    return rule


def _state_shape(shape: Shape, dt: str, planes: int = 2) -> tuple[int, int]:
    if len(shape) != 3 or shape[0] != planes or dt != "uint32":
        raise ShapeError(f"a sort stage reads the state uint32[{planes}, rows, n]; got "
                         f"{dt}{shape}")
    return shape[1], shape[2]


def _planes(p: dict[str, Any]) -> int:
    return int(p.get("planes", 2))


def _rows_shape(shape: Shape, dt: str, p: dict[str, Any]) -> tuple[int, int]:
    """(rows, n) of a stage's source: x[rows, n] on the first stage, else the state."""
    if p.get("first", False):
        if len(shape) != 2:
            raise ShapeError(f"a first sort stage reads x[rows, n]; got shape {shape}")
        return shape[0], shape[1]
    return _state_shape(shape, dt, _planes(p))


def _final_type(rows: int, n: int, p: dict[str, Any]) -> tuple[Shape, str]:
    return (rows, n), (str(p["dtype"]) if p["values"] else "int32")


def _rows_of(src: np.ndarray, p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(keys, payloads) of a stage's source: x itself (first stage) or the state."""
    if p.get("first", False):
        keys = sort_keys(src, bool(p["descending"]))
        if _planes(p) == 1:
            return keys, keys
        if p.get("values", False):
            return keys, _words(src)
        return keys, np.broadcast_to(np.arange(src.shape[-1], dtype=np.uint32), src.shape)
    keys = src[0].astype(np.uint32)
    return keys, (keys if _planes(p) == 1 else src[1].astype(np.uint32))


def _stage_out(keys: np.ndarray, pay: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    """The state, or (last stage) the payloads as indices or values."""
    keys_only = _planes(p) == 1
    if p.get("last", False):
        if keys_only:
            pay = sort_value_words(keys, p["dtype"], bool(p["descending"]))
        return _from_words(pay, p["dtype"]) if p["values"] else pay.astype(np.int32)
    return (keys[None] if keys_only else np.stack([keys, pay])).astype(np.uint32)


def _blocks_of(n: int, block: int) -> int:
    return max(1, -(-n // block))


def _digits(keys: np.ndarray, shift: int) -> np.ndarray:
    return ((keys >> np.uint32(shift)) & np.uint32(SORT_DIGITS - 1)).astype(np.int64)


# radix_hist: uint32[rows, D, blocks]
def _radix_hist_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    rows, n = _rows_shape(*ins[0], p)
    return (rows, SORT_DIGITS, _blocks_of(n, int(p["block"]))), "uint32"


def _radix_hist_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    keys, _ = _rows_of(args[0], p)
    rows, n = keys.shape
    nb = out[0][2]
    group = (np.arange(n) // int(p["block"]))[None, :] * SORT_DIGITS + _digits(keys, p["shift"])
    flat = (group + np.arange(rows)[:, None] * (nb * SORT_DIGITS)).ravel()
    counts = np.bincount(flat, minlength=rows * nb * SORT_DIGITS).reshape(rows, nb, SORT_DIGITS)
    return counts.transpose(0, 2, 1).astype(np.uint32)


# radix_scan: uint32[rows, D, blocks + 1]
def _radix_scan_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    shape, dt = ins[0]
    if len(shape) != 3 or shape[1] != SORT_DIGITS or dt != "uint32":
        raise ShapeError(f"radix_scan of a histogram uint32[rows, {SORT_DIGITS}, blocks]; got "
                         f"{dt}{shape}")
    return shape[:2] + (shape[2] + 1,), dt


def _radix_scan_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    """Per (row, digit): exclusive prefix sums of the counts over the blocks, then the total."""
    h = args[0].astype(np.int64)
    c = np.cumsum(h, axis=2)
    return np.concatenate([c - h, c[:, :, -1:]], axis=2).astype(np.uint32)


def _radix_scatter_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]
                        ) -> tuple[Shape, str]:
    rows, n = _rows_shape(*ins[0], p)
    want = (rows, SORT_DIGITS, _blocks_of(n, int(p["block"])) + 1)
    if tuple(ins[1]) != (want, "uint32"):
        raise ShapeError(f"radix_scatter's offsets must be uint32{want}; got {ins[1]}")
    return _final_type(rows, n, p) if p["last"] else ((_planes(p), rows, n), "uint32")


def _radix_scatter_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                         out: tuple[Shape, str]) -> np.ndarray:
    keys, pay = _rows_of(args[0], p)
    scanned = args[1].astype(np.int64)
    rows, n = keys.shape
    nb = scanned.shape[2] - 1
    # a digit's elements of block b go after the row's smaller digits and its earlier blocks
    totals = scanned[:, :, nb]
    offsets = scanned[:, :, :nb] + (np.cumsum(totals, axis=1) - totals)[:, :, None]
    digit = _digits(keys, p["shift"])
    blk = np.broadcast_to(np.arange(n) // int(p["block"]), (rows, n))
    # rank of each element among the earlier elements of its block with its digit
    group = blk * SORT_DIGITS + digit
    order = np.argsort(group, axis=-1, kind="stable")
    grouped = np.take_along_axis(group, order, axis=-1)
    size = nb * SORT_DIGITS
    counts = np.bincount((grouped + np.arange(rows)[:, None] * size).ravel(),
                         minlength=rows * size).reshape(rows, size)
    start = np.cumsum(counts, axis=1) - counts
    rank = np.empty((rows, n), dtype=np.int64)
    np.put_along_axis(rank, order, np.arange(n)[None, :] - np.take_along_axis(start, grouped, 1),
                      axis=-1)
    r = np.broadcast_to(np.arange(rows)[:, None], (rows, n))
    dst = offsets[r, digit, blk] + rank
    new_keys = np.zeros((rows, n), dtype=np.uint32)
    new_pay = np.zeros((rows, n), dtype=np.uint32)
    new_keys[r, dst] = keys
    new_pay[r, dst] = pay
    return _stage_out(new_keys, new_pay, p)


def _sorted_and_x(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[int, int, int]:
    """(rows, n, blocks) of sort_specials' and sort_fixup's first inputs, sorted values and x."""
    (s_shape, s_dt), (x_shape, x_dt) = ins[:2]
    if len(x_shape) != 2 or s_shape != x_shape or s_dt != x_dt or x_dt != "float32":
        raise ShapeError(f"sort_specials and sort_fixup read float32 sorted[rows, n] and "
                         f"x[rows, n]; got {s_dt}{s_shape}, {x_dt}{x_shape}")
    return x_shape[0], x_shape[1], _blocks_of(x_shape[1], int(p["block"]))


# sort_specials: inputs (sorted values[rows, n] float32, x[rows, n], the last radix pass's scanned
# histogram) -> uint32[rows, 2, blocks]: per block of x, how many zeros and how many NaNs
def _sort_specials_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]
                        ) -> tuple[Shape, str]:
    rows, _, nb = _sorted_and_x(ins, p)
    want = ((rows, SORT_DIGITS, nb + 1), "uint32")
    if tuple(ins[2]) != want:
        raise ShapeError(f"sort_specials reads the last pass's scanned histogram uint32{want[0]}; "
                         f"got {ins[2]}")
    return (rows, 2, nb), "uint32"


def _special_masks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x == 0, np.isnan(x)


def _sort_specials_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                         out: tuple[Shape, str]) -> np.ndarray:
    x = args[1]
    rows, n = x.shape
    nb = out[0][2]
    pad = nb * int(p["block"]) - n
    counts = [np.pad(m, ((0, 0), (0, pad))).reshape(rows, nb, -1).sum(axis=2)
              for m in _special_masks(x)]
    return np.stack(counts, axis=1).astype(np.uint32)


# sort_fixup: inputs (sorted values, x, specials, the last radix pass's scanned histogram) -> the
# sorted values with the runs of zeros and of NaNs replaced by x's zeros and NaNs in input order
# (written into the sorted values' buffer). The histogram's digit totals narrow where each run
# starts to the run of its key's top byte.
def _sort_fixup_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    rows, _, nb = _sorted_and_x(ins, p)
    if tuple(ins[2]) != ((rows, 2, nb), "uint32"):
        raise ShapeError(f"sort_fixup's counts must be uint32{(rows, 2, nb)}; got {ins[2]}")
    want = ((rows, SORT_DIGITS, nb + 1), "uint32")
    if len(ins) != 4 or tuple(ins[3]) != want:
        raise ShapeError(f"sort_fixup reads the last pass's scanned histogram uint32{want[0]}; "
                         f"got {ins[3:]}")
    return ins[0]


def _sort_fixup_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    srt, x = args[0].copy(), args[1]
    zk, nk = sort_special_keys(bool(p["descending"]))
    keys = sort_keys(srt, bool(p["descending"]))
    for r in range(x.shape[0]):
        for mask, key in zip(_special_masks(x[r]), (zk, nk)):
            start = int(np.searchsorted(keys[r], np.uint32(key), side="left"))
            vals = x[r][mask]
            srt[r, start:start + vals.size] = vals
    return srt


# sort_blocks: x[rows, n] -> state, each aligned block of ``block`` elements of a row sorted
def _sort_blocks_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    rows, n = _rows_shape(*ins[0], {"first": True})
    return (2, rows, n), "uint32"


def _sort_blocks_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                       out: tuple[Shape, str]) -> np.ndarray:
    keys, pay = _rows_of(args[0], {**p, "first": True})
    blk = np.broadcast_to(np.arange(keys.shape[1]) // int(p["block"]), keys.shape)
    order = np.lexsort((keys, blk), axis=-1)
    return _stage_out(np.take_along_axis(keys, order, -1), np.take_along_axis(pay, order, -1),
                      {"last": False})


# sort_merge: state sorted in runs of ``run`` -> runs of 2 * run (or, last, the final payloads)
def _sort_merge_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]) -> tuple[Shape, str]:
    rows, n = _state_shape(*ins[0])
    return _final_type(rows, n, p) if p["last"] else ((_planes(p), rows, n), "uint32")


def _sort_merge_numpy(args: Sequence[np.ndarray], p: dict[str, Any],
                      out: tuple[Shape, str]) -> np.ndarray:
    """Each element's place in its merged pair of runs: its place in its own run plus the count
    of the other run's elements before it (smaller keys; equal keys too for the right run), by
    binary search as the kernel does. Keys are made unique per (row, pair) by a prefix so that
    one search over all runs at once stays within the element's own pair."""
    keys, pay = args[0][0].astype(np.uint64), args[0][1]
    rows, n = keys.shape
    m = int(p["run"])
    pos = np.arange(n)
    q = pos // m
    pair = q // 2
    npairs = int(pair[-1]) + 1 if n else 1
    base = (np.arange(rows)[:, None] * npairs + pair[None, :]).astype(np.uint64) << np.uint64(32)
    comp = base | keys
    left = (q % 2 == 0)[None, :].repeat(rows, 0)
    lc, rc = comp[left], comp[~left]  # each sorted: runs in order, keys sorted within a run
    cb = base[left], base[~left]
    count = np.empty((rows, n), dtype=np.int64)
    count[left] = np.searchsorted(rc, comp[left], "left") - np.searchsorted(rc, cb[0], "left")
    count[~left] = np.searchsorted(lc, comp[~left], "right") - np.searchsorted(lc, cb[1], "left")
    dst = pair * 2 * m + (pos - q * m) + count
    r = np.broadcast_to(np.arange(rows)[:, None], (rows, n))
    new_keys = np.zeros((rows, n), dtype=np.uint32)
    new_pay = np.zeros((rows, n), dtype=np.uint32)
    new_keys[r, dst] = args[0][0]
    new_pay[r, dst] = pay
    return _stage_out(new_keys, new_pay, p)


def _searchsorted_type(ins: Sequence[tuple[Shape, str]], p: dict[str, Any]
                       ) -> tuple[Shape, str]:
    (a_shape, a_dt), (v_shape, v_dt) = ins
    if len(a_shape) != 1:
        raise ShapeError(f"searchsorted searches a 1-D array; got shape {a_shape}")
    if a_dt != v_dt:
        raise ShapeError(f"searchsorted compares equal dtypes; got {a_dt} and {v_dt}")
    if p.get("side") not in ("left", "right"):
        raise ShapeError(f"searchsorted side must be 'left' or 'right'; got {p.get('side')!r}")
    return v_shape, "int32"


def searchsorted_numpy(a: np.ndarray, v: np.ndarray, side: str) -> np.ndarray:
    """Reference of ``searchsorted``: the binary search the kernel runs, step for step (so an
    unsorted ``a`` gives the kernel's answer too), comparing order keys."""
    ka, kv = sort_keys(a), sort_keys(v)
    n = ka.shape[0]
    lo = np.zeros(kv.shape, dtype=np.int64)
    hi = np.full(kv.shape, n, dtype=np.int64)
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) // 2
        km = ka[np.minimum(mid, max(n - 1, 0))]
        right = (km < kv) if side == "left" else (km <= kv)
        lo = np.where(active & right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)
    return lo.astype(np.int32)


TYPE_RULES.update({
    Op.ARGSORT: _sort_type(False),
    Op.SORT: _sort_type(True),
    Op.RADIX_HIST: _radix_hist_type,
    Op.RADIX_SCAN: _radix_scan_type,
    Op.RADIX_SCATTER: _radix_scatter_type,
    Op.SORT_BLOCKS: _sort_blocks_type,
    Op.SORT_MERGE: _sort_merge_type,
    Op.SORT_SPECIALS: _sort_specials_type,
    Op.SORT_FIXUP: _sort_fixup_type,
    Op.SEARCHSORTED: _searchsorted_type,
})
NUMPY_RULES.update({
    Op.ARGSORT: _argsort_numpy,
    Op.SORT: _sort_numpy,
    Op.RADIX_HIST: _radix_hist_numpy,
    Op.RADIX_SCAN: _radix_scan_numpy,
    Op.RADIX_SCATTER: _radix_scatter_numpy,
    Op.SORT_BLOCKS: _sort_blocks_numpy,
    Op.SORT_MERGE: _sort_merge_numpy,
    Op.SORT_SPECIALS: _sort_specials_numpy,
    Op.SORT_FIXUP: _sort_fixup_numpy,
    Op.SEARCHSORTED: lambda args, p, out: searchsorted_numpy(args[0], args[1], p["side"]),
})


def slice_numpy(x: np.ndarray, starts: Sequence[int], steps: Sequence[int],
                shape: Shape) -> np.ndarray:
    """Reference of ``slice``: a view of x (basic slicing copies nothing)."""
    idx = []
    for s0, st, n in zip(starts, steps, shape):
        s0, st, n = int(s0), int(st), int(n)
        if n == 0:
            idx.append(slice(0, 0))
            continue
        stop = s0 + (n - 1) * st + (1 if st > 0 else -1)
        idx.append(slice(s0, stop if stop >= 0 else None, st))
    return x[tuple(idx)]


def gather_indices(index: np.ndarray, dim: int) -> np.ndarray:
    """A gather index as the GPU reads it: negative counts from the end, then clamped."""
    i = np.asarray(index).astype(np.int64)
    if np.asarray(index).dtype == np.uint32:
        return np.minimum(i, dim - 1)
    i = np.where(i < 0, i + dim, i)
    return np.clip(i, 0, dim - 1)


def gather_numpy(x: np.ndarray, indices: Sequence[np.ndarray], shape: Shape) -> np.ndarray:
    """Reference of ``gather``: out[o] = x[indices[0][o], indices[1][o], ...], the indices
    broadcast to out's shape."""
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype=x.dtype)
    if not indices:
        return np.broadcast_to(x, shape)
    rows = _row_take(x, indices)
    if rows is not None:  # rows of a table (an embedding lookup): one np.take
        return np.broadcast_to(np.take(x, gather_indices(rows, x.shape[0]), axis=0), shape)
    taken = _take_per_axis(x, indices, shape)
    if taken is not None:
        return taken
    # numpy broadcasts the index arrays itself: they are never expanded to out's shape
    idx = tuple(gather_indices(i, d) for i, d in zip(indices, x.shape))
    return np.broadcast_to(x[idx], shape)


def compact(a: np.ndarray) -> np.ndarray:
    """``a`` with the axes it is broadcast along (stride 0) taken once (length 1): its
    distinct values, a view."""
    return a[tuple(slice(0, 1) if st == 0 else slice(None) for st in a.strides)]


def _take_per_axis(x: np.ndarray, indices: Sequence[np.ndarray], shape: Shape
                   ) -> Optional[np.ndarray]:
    """A gather whose index for x's axis j varies along out's axis j alone (a window read or
    written by ``dynamic_slice`` and ``dynamic_update_slice``): one ``np.take`` per axis that
    is not read whole, each copying runs of elements (60x faster than numpy's element-wise
    fancy indexing for a decode step's cache update); else None."""
    if x.ndim != len(shape) or len(indices) != x.ndim:
        return None
    flat = []
    for j, i in enumerate(indices):
        i = np.asarray(i)
        if i.ndim != len(shape):
            return None
        i = compact(i)
        if any(n != 1 for a, n in enumerate(i.shape) if a != j):
            return None
        flat.append(i.reshape(-1))
    out = x
    for j, i in enumerate(flat):
        dim = x.shape[j]
        if dim == 1:
            continue  # every index clamps to 0: a broadcast (below), not a copy
        if i.size == dim and np.array_equal(i, _arange(dim)):
            continue  # the whole axis, in order (indices in range: nothing to clamp)
        out = np.take(out, gather_indices(i, dim), axis=j)
    return np.broadcast_to(out, shape)


def _arange(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 (an axis read whole is told from others by it), kept for short axes."""
    return _short_arange(n) if n <= 1 << 16 else np.arange(n)


@functools.lru_cache(maxsize=64)
def _short_arange(n: int) -> np.ndarray:
    a = np.arange(n)
    a.flags.writeable = False
    return a


def _row_take(x: np.ndarray, indices: Sequence[np.ndarray]) -> Optional[np.ndarray]:
    """For x[R, D] indexed by (rows[..., 1], arange(D) along the last axis), as fnp.take along
    axis 0 traces: rows without its last axis; else None."""
    if x.ndim != 2 or len(indices) != 2:
        return None
    rows, cols = indices
    d = x.shape[1]
    if (rows.ndim < 1 or rows.shape[-1] != 1 or cols.ndim != rows.ndim or cols.shape[-1] != d
            or math.prod(cols.shape) != d):
        return None
    if not np.array_equal(cols.reshape(-1), np.arange(d)):
        return None
    return rows[..., 0]


def iota_numpy(shape: Shape, axis: int, dtype: str) -> np.ndarray:
    """Reference of ``iota``: a read-only broadcast of one ``arange`` (materialised, argmax's
    iota over 2048 x 2048 rows made the interpreter's argmax take 43 ms; so, 9)."""
    n = shape[axis]
    view = [1] * len(shape)
    view[axis] = n
    return np.broadcast_to(np.arange(n, dtype=np.int64).astype(dtype).reshape(view), shape)


# --- derivative rules of the other ops (fusec.autodiff) -------------------------------------------
# VJP_RULES[op](b, params, ins, outs, cts) -> one cotangent (or None: zero, or not differentiable)
# per input; JVP_RULES[op](b, params, ins, outs, tangents) -> one tangent (or None) per output.
# ins are tracers or Python scalars (literal operands); tangents/cts entries may be None (zero).
# Elementwise ops share one rule each way, built from their ``deriv`` above. Ops whose results
# are integers (argsort, searchsorted, iota, comparisons) have no derivative: NO_DERIVATIVE.


def ad_shape(x: Any) -> Shape:
    return tuple(x.shape) if hasattr(x, "shape") else ()


def ad_is_float(x: Any) -> bool:
    if isinstance(x, (bool, int)):
        return False
    if isinstance(x, float):
        return True
    return dtypes.is_float(str(getattr(x, "var", x).dtype))


def ad_sum_to(b: Any, g: Any, shape: Shape) -> Any:
    """Sum the broadcast axes of ``g`` away: the cotangent of an operand of ``shape``."""
    gs = ad_shape(g)
    if gs == tuple(shape):
        return g
    if len(gs) < len(shape) or any(s != 1 and s != d for s, d in zip(shape[::-1], gs[::-1])):
        return b.bind(Op.BROADCAST, [ad_atom(g)], {"shape": tuple(shape)})
    lead = len(gs) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + k for k, d in enumerate(shape)
                                      if d == 1 and gs[lead + k] != 1)
    if axes:
        g = b.bind(Op.SUM, [g], {"axes": axes})
    if ad_shape(g) != tuple(shape):
        g = b.bind(Op.RESHAPE, [g], {"shape": tuple(shape)})
    return g


def ad_broadcast(b: Any, g: Any, shape: Shape) -> Any:
    if ad_shape(g) == tuple(shape):
        return g
    return b.bind(Op.BROADCAST, [ad_atom(g)], {"shape": tuple(shape)})


def ad_zeros(b: Any, shape: Shape, dtype: str = "float32") -> Any:
    from .ir import Lit as _Lit

    zero: Any = 0.0 if dtypes.is_float(dtype) else 0
    return b.bind(Op.BROADCAST, [_Lit(zero, dtype)], {"shape": tuple(shape)})


def _elementwise_vjp(b: Any, op: Op, params: dict[str, Any], ins: Sequence[Any],
                     outs: Sequence[Any], cts: Sequence[Any]) -> list[Any]:
    deriv = _deriv_of(op, params)
    res: list[Any] = []
    for i, x in enumerate(ins):
        if deriv is None or not ad_is_float(x) or isinstance(x, float) or cts[0] is None:
            res.append(None)
            continue
        c = deriv(b, ins, outs[0], cts[0], i)
        res.append(None if c is None else ad_sum_to(b, c, ad_shape(x)))
    return res


def _elementwise_jvp(b: Any, op: Op, params: dict[str, Any], ins: Sequence[Any],
                     outs: Sequence[Any], tangents: Sequence[Any]) -> list[Any]:
    deriv = _deriv_of(op, params)
    if deriv is None or not ad_is_float(outs[0]):
        return [None]
    total = None
    for i, t in enumerate(tangents):
        if t is None:
            continue
        c = deriv(b, ins, outs[0], t, i)
        if c is not None:
            total = c if total is None else total + c
    return [None if total is None else ad_broadcast(b, total, ad_shape(outs[0]))]


def _deriv_of(op: Op, params: dict[str, Any]) -> Optional[Callable[..., Any]]:
    if op is Op.CAST:  # float -> float only: other casts have no float result or operand
        # (autodiff casts each cotangent to its value's dtype: float16 <-> float32 casts)
        return _D_ID if dtypes.is_float(str(params.get("dtype"))) else None
    if op is Op.COPY:  # an identity (no row in the table: nothing traces it today)
        return _D_ID
    if op is Op.IPOW:
        n = int(params["n"])
        if n == 0:
            return _D_NONE
        return lambda b, ins, out, g, i: g * (float(n) * (
            ins[0] if n == 2 else b.bind(Op.IPOW, [ad_atom(ins[0])], {"n": n - 1})))
    info = ELEMENTWISE.get(op)
    return None if info is None else info.deriv


def _keep(shape: Shape, axes: Sequence[int]) -> Shape:
    return tuple(1 if k in axes else d for k, d in enumerate(shape))


def _reduce_back(b: Any, g: Any, x_shape: Shape, axes: Sequence[int]) -> Any:
    """A reduction's cotangent broadcast back over the reduced axes."""
    g = b.bind(Op.RESHAPE, [g], {"shape": _keep(x_shape, axes)})
    return ad_broadcast(b, g, x_shape)


def _argmax_mask(b: Any, x: Any, y: Any, axes: Sequence[int]) -> Any:
    """Where x attains its reduction y, divided by how many places do (ties share equally)."""
    yk = _reduce_back(b, y, ad_shape(x), axes)
    hit = b.bind(Op.CAST, [b.bind(Op.EQ, [x, yk])], {"dtype": "float32"})
    count = _reduce_back(b, b.bind(Op.SUM, [hit], {"axes": tuple(axes)}), ad_shape(x), axes)
    return hit / count


def _prod_others(b: Any, x: Any, axes: Sequence[int]) -> Any:
    """For each element, the product of the others it is reduced with (no division: exact
    where there are zeros): exclusive products from both ends, multiplied."""
    shape = ad_shape(x)
    kept = [k for k in range(len(shape)) if k not in axes]
    perm = tuple(kept) + tuple(axes)
    n = math.prod(shape[k] for k in axes)
    rows = b.bind(Op.RESHAPE, [b.bind(Op.TRANSPOSE, [x], {"perm": perm})],
                  {"shape": tuple(shape[k] for k in kept) + (n,)})
    ax = len(kept)

    def exclusive(reverse: bool) -> Any:
        c = b.bind(Op.CUMULATIVE, [rows], {"reduce": "prod", "axis": ax, "reverse": reverse})
        widths = tuple((0, 0) for _ in kept) + (((0, 1),) if reverse else ((1, 0),))
        padded = b.bind(Op.PAD, [c], {"widths": widths, "value": 1.0})
        starts = (0,) * len(kept) + ((1,) if reverse else (0,))
        return b.bind(Op.SLICE, [padded], {"starts": starts, "steps": (1,) * (ax + 1),
                                            "shape": ad_shape(rows)})

    others = exclusive(False) * exclusive(True)
    back = b.bind(Op.RESHAPE, [others], {"shape": tuple(shape[k] for k in perm)})
    inv = tuple(int(i) for i in np.argsort(perm))
    return b.bind(Op.TRANSPOSE, [back], {"perm": inv})


def _reduce_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                cts: Sequence[Any]) -> list[Any]:
    x, (y,), (g,) = ins[0], outs, cts
    if not ad_is_float(x):
        return [None]
    axes = tuple(p["axes"])
    gb = _reduce_back(b, g, ad_shape(x), axes)
    if op is Op.SUM:
        return [gb]
    if op is Op.PROD:
        return [gb * _prod_others(b, x, axes)]
    return [gb * _argmax_mask(b, x, y, axes)]


def _reduce_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                ts: Sequence[Any]) -> list[Any]:
    x, (y,), (t,) = ins[0], outs, ts
    axes = tuple(p["axes"])
    if op is Op.SUM:
        return [b.bind(Op.SUM, [t], {"axes": axes})]
    w = _prod_others(b, x, axes) if op is Op.PROD else _argmax_mask(b, x, y, axes)
    return [b.bind(Op.SUM, [t * w], {"axes": axes})]


def _swap_last(b: Any, x: Any) -> Any:
    n = len(ad_shape(x))
    perm = tuple(range(n - 2)) + (n - 1, n - 2)
    return b.bind(Op.TRANSPOSE, [x], {"perm": perm})


def _matmul_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                cts: Sequence[Any]) -> list[Any]:
    a, w = ins
    g = cts[0]
    if not ad_is_float(a):
        return [None, None]
    # the matmul kernels read a transposed operand in place: no transpose is materialised
    return [b.bind(Op.MATMUL, [g, _swap_last(b, w)]), b.bind(Op.MATMUL, [_swap_last(b, a), g])]


def _matmul_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                ts: Sequence[Any]) -> list[Any]:
    a, w = ins
    ta, tw = ts
    total = None if ta is None else b.bind(Op.MATMUL, [ta, w])
    if tw is not None:
        other = b.bind(Op.MATMUL, [a, tw])
        total = other if total is None else total + other
    return [total]


def _linear_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                ts: Sequence[Any]) -> list[Any]:
    """Ops linear in their first operand (movement, gather, sum-scans): the op on the tangent."""
    if ts[0] is None:
        return [None]
    params = dict(p)
    if op is Op.PAD:
        params["value"] = 0.0
    # the other operands are a gather's indices: literal ones stay integers (ad_atom would make
    # a Python int a float32 literal, which a gather refuses)
    rest = [ad_int(int(x)) if isinstance(x, (int, float)) else x for x in ins[1:]]
    return [b.bind(op, [ts[0], *rest], params)]


def _index_grid(b: Any, shape: Shape, last: Any) -> list[Any]:
    """Index arrays for every axis of ``shape``: iotas, with ``last`` for the last axis."""
    idx = [b.bind(Op.IOTA, [], {"shape": tuple(shape), "axis": k, "dtype": "int32"})
           for k in range(len(shape) - 1)]
    return idx + [last]


def _movement_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                  cts: Sequence[Any]) -> list[Any]:
    x, g = ins[0], cts[0]
    if not ad_is_float(x):
        return [None] * len(ins)
    xs = ad_shape(x)
    if op is Op.RESHAPE:
        return [b.bind(Op.RESHAPE, [g], {"shape": xs})]
    if op is Op.TRANSPOSE:
        inv = tuple(int(i) for i in np.argsort(tuple(p["perm"])))
        return [b.bind(Op.TRANSPOSE, [g], {"perm": inv})]
    if op is Op.BROADCAST:
        return [ad_sum_to(b, g, xs)]
    if op is Op.PAD:
        starts = tuple(lo for lo, _ in p["widths"])
        return [b.bind(Op.SLICE, [g], {"starts": starts, "steps": (1,) * len(xs),
                                       "shape": xs})]
    # SLICE: step-1 windows pad the cotangent back; strided or reversed ones scatter-add it
    starts, steps, shape = tuple(p["starts"]), tuple(p["steps"]), ad_shape(outs[0])
    if all(s == 1 for s in steps):
        widths = tuple((st, n - st - m) for st, n, m in zip(starts, xs, shape))
        return [b.bind(Op.PAD, [g], {"widths": widths, "value": 0.0})]
    idx = []
    for k, (st, sp) in enumerate(zip(starts, steps)):
        io = b.bind(Op.IOTA, [], {"shape": shape, "axis": k, "dtype": "int32"})
        idx.append(io * sp + st if (sp, st) != (1, 0) else io)
    return [b.bind(Op.SCATTER, [ad_zeros(b, xs, ad_float(g)), g, *idx], {"mode": "add"})]


def _clamped(b: Any, i: Any, n: int) -> Any:
    """A gather index as the gather reads it: negative from the end, then clamped."""
    if isinstance(i, (int, float)):
        v = int(i) + n if int(i) < 0 else int(i)
        return min(max(v, 0), n - 1)
    if str(i.var.dtype) == "int32":
        i = b.bind(Op.WHERE, [b.bind(Op.LT, [i, ad_int(0)]), i + n, i])
        return b.bind(Op.MIN, [b.bind(Op.MAX, [i, ad_int(0)]), ad_int(n - 1)])
    return b.bind(Op.MIN, [i, ad_int(n - 1, "uint32")])


def ad_int(v: int, dtype: str = "int32") -> Any:
    from .ir import Lit as _Lit

    return _Lit(int(v), dtype)


def _in_bounds(b: Any, i: Any, n: int) -> Any:
    """Whether a scatter index lands inside an axis of length n (after counting from the end)."""
    if isinstance(i, (int, float)):
        v = int(i) + n if int(i) < 0 else int(i)
        return 0 <= v < n
    if str(i.var.dtype) == "int32":
        j = b.bind(Op.WHERE, [b.bind(Op.LT, [i, ad_int(0)]), i + n, i])
        return b.bind(Op.AND, [b.bind(Op.GE, [j, ad_int(0)]), b.bind(Op.LT, [j, ad_int(n)])])
    return b.bind(Op.LT, [i, ad_int(n, "uint32")])


def _row_pick_axis(x: Any, idx: Sequence[Any], out_shape: Shape) -> Optional[tuple[int, bool]]:
    """``(a, dropped)`` when a gather picks one element per row along axis a (take_along_axis
    with one index per row, or ``x[arange(n), labels]``, as cross-entropy does): every other
    index is the iota of its own axis. ``dropped``: the result has no axis a (else length 1)."""
    xs = ad_shape(x)
    producer = getattr(getattr(x, "builder", None), "producer", {})
    for dropped in (False, True):
        if len(out_shape) != len(xs) - dropped:
            continue
        picked = None
        ok = True
        for k, i in enumerate(idx):
            e = producer.get(id(i.var)) if hasattr(i, "var") else None
            if picked is not None and dropped:
                ko = k - 1
            else:
                ko = k
            if e is not None and e.op is Op.IOTA and 0 <= ko < len(out_shape) and \
                    int(e.params["axis"]) == ko and out_shape[ko] == xs[k] and \
                    len(ad_shape(i)) == len(out_shape):
                continue
            if picked is not None or (not dropped and out_shape[k] != 1):
                ok = False
                break
            picked = k
        if ok and picked is not None:
            return picked, dropped
    return None


def _gather_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                cts: Sequence[Any]) -> list[Any]:
    x, g = ins[0], cts[0]
    if not ad_is_float(x):
        return [None] * len(ins)
    xs = ad_shape(x)
    found = _row_pick_axis(x, ins[1:], ad_shape(outs[0]))
    if found is not None:
        # one pick per row: the cotangent is a select against the row's iota, elementwise, so
        # that it fuses (a scatter would be a kernel of its own)
        a, dropped = found
        pick = _clamped(b, ins[1 + a], xs[a])
        if dropped:
            kept = ad_shape(outs[0])
            unit = kept[:a] + (1,) + kept[a:]
            g = b.bind(Op.RESHAPE, [g], {"shape": unit})
            if hasattr(pick, "var"):
                pick = b.bind(Op.RESHAPE, [ad_broadcast(b, pick, kept)], {"shape": unit})
        io = b.bind(Op.IOTA, [], {"shape": xs, "axis": a, "dtype": str(
            pick.var.dtype) if hasattr(pick, "var") else "int32"})
        hit = b.bind(Op.EQ, [io, ad_atom(pick) if hasattr(pick, "var") else ad_int(pick)])
        return [b.bind(Op.WHERE, [hit, ad_broadcast(b, g, xs), ad_atom(0.0, ad_float(g))])] + \
            [None] * (len(ins) - 1)
    idx = [ad_atom(_clamped(b, i, n)) if not isinstance(i, (int, float)) else
           ad_int(_clamped(b, i, n)) for i, n in zip(ins[1:], xs)]
    ct = b.bind(Op.SCATTER, [ad_zeros(b, xs, ad_float(g)), g, *idx], {"mode": "add"})
    return [ct] + [None] * (len(ins) - 1)


def _scatter_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                 cts: Sequence[Any]) -> list[Any]:
    operand, updates, idx = ins[0], ins[1], ins[2:]
    g = cts[0]
    if not ad_is_float(operand):
        return [None] * len(ins)
    mode = p["mode"]
    if mode not in ("set", "add"):
        from .errors import TraceError

        raise TraceError(f"grad of a scatter with mode '{mode}' (.at[].{mode}) is not supported "
                         "yet; only .at[].set and .at[].add are differentiable")
    xs = ad_shape(operand)
    atoms = [ad_atom(i) if not isinstance(i, (int, float)) else ad_int(int(i)) for i in idx]
    ct_operand = g
    if mode == "set":  # written-over places take no gradient
        ct_operand = b.bind(Op.SCATTER, [g, ad_atom(0.0, ad_float(g)), *atoms], {"mode": "set"})
    shape = broadcast_shapes(ad_shape(updates), *(ad_shape(i) for i in idx))
    read = b.bind(Op.GATHER, [g, *[ad_atom(_clamped(b, i, n)) if not isinstance(i, (int, float))
                                   else ad_int(_clamped(b, i, n)) for i, n in zip(idx, xs)]])
    read = ad_broadcast(b, read, shape)
    ok = None
    for i, n in zip(idx, xs):
        m = _in_bounds(b, i, n)
        if isinstance(m, bool):
            if not m:
                ok = False
            continue
        ok = m if ok is None or ok is True else (ok if ok is False else b.bind(Op.AND, [ok, m]))
    if ok is False:
        read = ad_zeros(b, shape, ad_float(g))
    elif ok is not None:
        read = b.bind(Op.WHERE, [ok, read, ad_atom(0.0, ad_float(g))])
    ct_updates = ad_sum_to(b, read, ad_shape(updates)) if ad_is_float(updates) and not \
        isinstance(updates, float) else None
    return [ct_operand, ct_updates] + [None] * len(idx)


def _scatter_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                 ts: Sequence[Any]) -> list[Any]:
    mode = p["mode"]
    if mode not in ("set", "add"):
        from .errors import TraceError

        raise TraceError(f"jvp of a scatter with mode '{mode}' (.at[].{mode}) is not supported "
                         "yet; only .at[].set and .at[].add are differentiable")
    if ts[0] is None and ts[1] is None:
        return [None]
    t_op = ts[0] if ts[0] is not None else ad_zeros(b, ad_shape(ins[0]), ad_float(ins[0]))
    t_up = ts[1] if ts[1] is not None else ad_atom(0.0, ad_float(ins[0]))
    atoms = [ad_atom(i) if not isinstance(i, (int, float)) else ad_int(int(i)) for i in ins[2:]]
    return [b.bind(Op.SCATTER, [t_op, t_up, *atoms], {"mode": mode})]


def _running_index(b: Any, x: Any, y: Any, p: dict[str, Any]) -> Any:
    """For cummax/cummin: the position along the axis whose value each running result took."""
    shape, axis, reverse = ad_shape(x), int(p["axis"]), bool(p.get("reverse", False))
    io = b.bind(Op.IOTA, [], {"shape": shape, "axis": axis, "dtype": "int32"})
    # a NaN is the running extreme from where it occurs (NaN == NaN is false: without this, its
    # results' derivatives went to the last number before it, which does not change them)
    hit = b.bind(Op.OR, [b.bind(Op.EQ, [x, y]), b.bind(Op.ISNAN, [x])])
    # the latest position (in scan order) where the running extreme was reached
    fill = ad_int(shape[axis] if reverse else -1)
    marked = b.bind(Op.WHERE, [hit, io, fill])
    return b.bind(Op.CUMULATIVE, [marked], {"reduce": "min" if reverse else "max", "axis": axis,
                                            "reverse": reverse})


def _axis_indices(b: Any, shape: Shape, axis: int, along: Any) -> list[Any]:
    return [along if k == axis else b.bind(Op.IOTA, [], {"shape": shape, "axis": k,
                                                          "dtype": "int32"})
            for k in range(len(shape))]


def _cumprod_zeros(b: Any, x: Any, p: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
    """For cumprod's derivatives without dividing by zero: where x is 0, x with its zeros made
    1, that one's cumprod, and where the running count of zeros is 0 and where it is 1. (The
    derivative of a running product by x_i is the product of the others: y / x_i while no zero
    came; with one zero, nonzero only at that zero; with two, zero.)"""
    zero = b.bind(Op.EQ, [x, ad_atom(0.0, ad_float(x))])
    safe = b.bind(Op.WHERE, [zero, ad_atom(1.0, ad_float(x)), x])
    ys = b.bind(Op.CUMULATIVE, [safe], dict(p))
    count = b.bind(Op.CUMULATIVE, [b.bind(Op.CAST, [zero], {"dtype": "int32"})],
                   {**p, "reduce": "sum"})
    return (zero, safe, ys, b.bind(Op.EQ, [count, ad_int(0)]),
            b.bind(Op.EQ, [count, ad_int(1)]))


def _cumulative_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                    cts: Sequence[Any]) -> list[Any]:
    x, y, g = ins[0], outs[0], cts[0]
    if not ad_is_float(x):
        return [None]
    axis, reverse, reduce = int(p["axis"]), bool(p.get("reverse", False)), p["reduce"]
    if reduce == "sum":
        return [b.bind(Op.CUMULATIVE, [g], {"reduce": "sum", "axis": axis,
                                            "reverse": not reverse})]
    if reduce == "prod":
        zero, safe, ys, none, one = _cumprod_zeros(b, x, p)
        gy = g * ys

        def back(v: Any) -> Any:
            return b.bind(Op.CUMULATIVE, [v], {"reduce": "sum", "axis": axis,
                                               "reverse": not reverse})
        # a zero x_i: the later products up to the next zero, without it; any other x_i: the
        # later products while no zero came, divided by x_i
        return [b.bind(Op.WHERE, [zero, back(b.bind(Op.WHERE, [one, gy, ad_atom(0.0)])),
                                  back(b.bind(Op.WHERE, [none, gy, ad_atom(0.0)])) / safe])]
    where = _running_index(b, x, y, p)
    shape = ad_shape(x)
    return [b.bind(Op.SCATTER, [ad_zeros(b, shape, ad_float(g)), g,
                                *_axis_indices(b, shape, axis, where)], {"mode": "add"})]


def _cumulative_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                    ts: Sequence[Any]) -> list[Any]:
    x, y, t = ins[0], outs[0], ts[0]
    reduce = p["reduce"]
    if reduce == "sum":
        return [b.bind(Op.CUMULATIVE, [t], dict(p))]
    if reduce == "prod":
        zero, safe, ys, none, one = _cumprod_zeros(b, x, p)

        def run(v: Any) -> Any:
            return b.bind(Op.CUMULATIVE, [v], {**p, "reduce": "sum"})
        # no zero so far: y * sum(t / x); one zero: the others' product times its tangent
        at_zero = run(b.bind(Op.WHERE, [zero, t, ad_atom(0.0)]))
        inner = b.bind(Op.WHERE, [none, run(t / safe),
                                  b.bind(Op.WHERE, [one, at_zero, ad_atom(0.0)])])
        return [ys * inner]
    where = _running_index(b, x, y, p)
    return [b.bind(Op.GATHER, [t, *_axis_indices(b, ad_shape(x), int(p["axis"]), where)])]


def _sort_order(b: Any, x: Any, p: dict[str, Any]) -> Any:
    return b.bind(Op.ARGSORT, [x], {"descending": bool(p.get("descending", False))})


def _sort_vjp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
              cts: Sequence[Any]) -> list[Any]:
    x, g = ins[0], cts[0]
    if not ad_is_float(x):
        return [None]
    shape = ad_shape(x)
    order = _sort_order(b, x, p)
    return [b.bind(Op.SCATTER, [ad_zeros(b, shape, ad_float(g)), g,
                                *_index_grid(b, shape, order)], {"mode": "add"})]


def _sort_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
              ts: Sequence[Any]) -> list[Any]:
    shape = ad_shape(ins[0])
    order = _sort_order(b, ins[0], p)
    return [b.bind(Op.GATHER, [ts[0], *_index_grid(b, shape, order)])]


def _custom_vjp_jvp(b: Any, op: Op, p: dict[str, Any], ins: Sequence[Any], outs: Sequence[Any],
                    ts: Sequence[Any]) -> list[Any]:
    from .errors import TraceError

    raise TraceError("forward-mode autodiff (jvp, jacfwd) cannot go through a function defined "
                     "with fusec.custom_vjp: it only has a reverse-mode rule (as in JAX)")


_Rule = Callable[[Any, Op, dict[str, Any], Sequence[Any], Sequence[Any], Sequence[Any]], list[Any]]
VJP_RULES: dict[Op, _Rule] = {}
JVP_RULES: dict[Op, _Rule] = {}
for _op in list(ELEMENTWISE) + [Op.CAST, Op.IPOW, Op.COPY]:
    VJP_RULES[_op] = _elementwise_vjp
    JVP_RULES[_op] = _elementwise_jvp
for _op in (Op.SUM, Op.RMAX, Op.RMIN, Op.PROD):
    VJP_RULES[_op] = _reduce_vjp
    JVP_RULES[_op] = _reduce_jvp
for _op in (Op.RESHAPE, Op.TRANSPOSE, Op.BROADCAST, Op.PAD, Op.SLICE):
    VJP_RULES[_op] = _movement_vjp
    JVP_RULES[_op] = _linear_jvp
VJP_RULES.update({Op.MATMUL: _matmul_vjp, Op.GATHER: _gather_vjp, Op.SCATTER: _scatter_vjp,
                  Op.CUMULATIVE: _cumulative_vjp, Op.SORT: _sort_vjp})
JVP_RULES.update({Op.MATMUL: _matmul_jvp, Op.GATHER: _linear_jvp, Op.SCATTER: _scatter_jvp,
                  Op.CUMULATIVE: _cumulative_jvp, Op.SORT: _sort_jvp,
                  Op.CUSTOM_VJP: _custom_vjp_jvp})
# integer results: nothing to differentiate (rules that say so, so that coverage is checkable)
NO_DERIVATIVE = frozenset({Op.IOTA, Op.ARGSORT, Op.SEARCHSORTED})
# ops that only exist after the lowering passes; autodiff runs on traced programs, before them
LOWERED_ONLY = frozenset({Op.PARTIAL, Op.ATTENTION, Op.ATTENTION_PARTS,
                          Op.ATTENTION_COMBINE, Op.QMATMUL, Op.SCATTER_ADD,
                          Op.SCATTER_INTO, Op.SCAN_REDUCE, Op.SCAN, Op.RADIX_HIST, Op.RADIX_SCAN,
                          Op.RADIX_SCATTER, Op.SORT_BLOCKS, Op.SORT_MERGE, Op.SORT_SPECIALS,
                          Op.SORT_FIXUP, Op.KERNEL})
# the custom_vjp marker's reverse rule is fusec.autodiff's (it calls the user's function)
TYPE_RULES[Op.CUSTOM_VJP] = lambda ins, p: ins[0]
NUMPY_RULES[Op.CUSTOM_VJP] = lambda a, p, t: a[0]


def reduce_shape(shape: Shape, axes: tuple[int, ...]) -> Shape:
    return tuple(d for k, d in enumerate(shape) if k not in axes)


# --- attention (fusec.passes.attention, fusec.kernels.attention) ---------------------------------


def _attention_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                    ) -> tuple[Shape, str]:
    """q[..., S, D], kt[..., D, T], v[..., T, E] (and a bias broadcasting to [..., S, T]) ->
    [..., S, E]"""
    (q, dt), (kt, _), (v, _) = in_types[:3]
    scores = matmul_shape(q, kt)
    if len(in_types) > 3 and broadcast_shapes(in_types[3][0], scores) != scores:
        raise ShapeError(f"attention bias of shape {in_types[3][0]} does not broadcast to the "
                         f"scores' {scores}")
    return matmul_shape(scores, v), dt


def _attention_scores(args: Sequence[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    """q @ kt * scale (+ bias): the scores of attention's inputs, in float32."""
    s = np.matmul(args[0], args[1]) * np.float32(params["scale"])
    return s + args[3] if len(args) > 3 else s


def attention_numpy(args: Sequence[np.ndarray], params: dict[str, Any],
                    out: tuple[Shape, str]) -> np.ndarray:
    """The reference: the computation the rewrite pass replaced, op by op in float32."""
    v = args[2]
    s = _attention_scores(args, params)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.matmul(e / e.sum(axis=-1, keepdims=True), v).astype(out[1])


TYPE_RULES[Op.ATTENTION] = _attention_type
NUMPY_RULES[Op.ATTENTION] = attention_numpy


def part_keys(t: int, parts: int) -> int:
    """Keys in each part of an ``attention_parts`` over ``t`` keys (the last part may have
    fewer)."""
    return -(-t // parts)


def _attention_parts_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                          ) -> tuple[Shape, str]:
    """attention's inputs -> [..., S, P, E + 2]: per part, the weighted values, the maximum
    score and the sum of the weights."""
    out, dt = _attention_type(in_types, params)
    parts, t = int(params["parts"]), in_types[1][0][-1]
    if parts < 1 or part_keys(t, parts) * (parts - 1) >= t:
        raise ShapeError(f"attention_parts: {parts} parts of {t} keys leave a part empty")
    return out[:-1] + (parts, out[-1] + 2), dt


def attention_parts_numpy(args: Sequence[np.ndarray], params: dict[str, Any],
                          out: tuple[Shape, str]) -> np.ndarray:
    """The reference of attention_parts, as its kernel computes it: each part's maximum score
    ignores NaN (a NaN score weighs NaN), and a -inf score weighs 0."""
    v = args[2]
    s = _attention_scores(args, params)
    t, parts = s.shape[-1], int(params["parts"])
    c = part_keys(t, parts)
    res = np.zeros(s.shape[:-1] + (parts, v.shape[-1] + 2), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for p in range(parts):
            sp = s[..., p * c:(p + 1) * c]
            m = np.where(np.isnan(sp), -np.inf, sp).max(axis=-1, keepdims=True)
            w = np.where(sp == -np.inf, np.float32(0), np.exp(sp - m))
            res[..., p, :-2] = np.matmul(w, v[..., p * c:(p + 1) * c, :])
            res[..., p, -2] = m[..., 0]
            res[..., p, -1] = w.sum(axis=-1)
    return res.astype(out[1])


def _attention_combine_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                            ) -> tuple[Shape, str]:
    """[..., S, P, E + 2] -> [..., S, E]"""
    shape, dt = in_types[0]
    if len(shape) < 3 or shape[-1] < 3:
        raise ShapeError(f"attention_combine takes parts [..., S, P, E + 2], not {shape}")
    return shape[:-2] + (shape[-1] - 2,), dt


def attention_combine_numpy(args: Sequence[np.ndarray], params: dict[str, Any],
                            out: tuple[Shape, str]) -> np.ndarray:
    """The parts rescaled to the row's maximum (every part's maximum is a number or -inf: a row
    of -inf scores only is NaN, 0 / 0, as attention's is)."""
    parts = args[0]
    m = parts[..., -2:-1]
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.exp(m - m.max(axis=-2, keepdims=True))
        num = (parts[..., :-2] * w).sum(axis=-2)
        den = (parts[..., -1:] * w).sum(axis=-2)
        return (num / den).astype(out[1])


TYPE_RULES[Op.ATTENTION_PARTS] = _attention_parts_type
NUMPY_RULES[Op.ATTENTION_PARTS] = attention_parts_numpy
TYPE_RULES[Op.ATTENTION_COMBINE] = _attention_combine_type
NUMPY_RULES[Op.ATTENTION_COMBINE] = attention_combine_numpy


# --- quantized weights (fusec.quant, fusec.passes.quant, fusec.kernels.quant) --------------------
# A matrix of shape (N, K) in GGUF's block formats, K a multiple of QUANT_BLOCK, held as uint32
# words, each matrix row its K // 32 blocks one after another:
#   q4_1, 5 words a block: word 0 = f16 scale d (low 16 bits) | f16 minimum m (high 16 bits);
#     words 1..4 = 16 bytes, little-endian, byte j holding value j in its low nibble and value
#     j + 16 in its high nibble: x = d * q + m, q in 0..15
#   q8_0, 9 words a block: word 0 = f16 scale d (low 16 bits; the high ones 0); words 1..8 =
#     the 32 int8 values, little-endian: x = d * q
# The words are exactly GGUF's block bytes for q4_1 (20 bytes); q8_0's 34 bytes get two bytes of
# padding after the scale, so that every block starts on a word.

QUANT_BLOCK = 32
# Products with at most this many rows of x (all leading axes together) run as one quantized
# product kernel (qmatmul); why 16: fusec/kernels/quant.py
QMATMUL_M = 16
QUANT_WORDS = {"q4_1": 5, "q8_0": 9}


def quant_words_shape(fmt: str, shape: Shape) -> Shape:
    """The shape of the words holding a matrix of ``shape`` (N, K) in format ``fmt``."""
    n, k = shape
    return (n, k // QUANT_BLOCK * QUANT_WORDS[fmt])


def _quant_params(params: dict[str, Any], what: str) -> tuple[str, int, int]:
    fmt = params["fmt"]
    if fmt not in QUANT_WORDS:
        raise ShapeError(f"{what}: unknown quantization format {fmt!r}; expected one of "
                         f"{sorted(QUANT_WORDS)}")
    if "shape" in params:
        n, k = (int(d) for d in params["shape"])
    else:
        n, k = int(params["n"]), int(params["k"])
    if n < 0 or k < 0 or k % QUANT_BLOCK:
        raise ShapeError(f"{what}: a quantized matrix's K must be a multiple of {QUANT_BLOCK}; "
                         f"got shape ({n}, {k})")
    return fmt, n, k


def _check_words(in_type: tuple[Shape, str], fmt: str, n: int, k: int, what: str) -> None:
    shape, dt = in_type
    want = quant_words_shape(fmt, (n, k))
    if dt != "uint32" or tuple(shape) != want:
        raise ShapeError(f"{what}: the {fmt} words of a ({n}, {k}) matrix must be uint32 of "
                         f"shape {want}; got {dt} of shape {tuple(shape)}")


def _dequant_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                  ) -> tuple[Shape, str]:
    fmt, n, k = _quant_params(params, "dequant")
    _check_words(in_types[0], fmt, n, k, "dequant")
    return (n, k), "float32"


def _qmatmul_type(in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
                  ) -> tuple[Shape, str]:
    fmt, n, k = _quant_params(params, "qmatmul")
    (xs, xdt), words = in_types[:2]
    if xdt != "float32" or len(xs) < 1 or xs[-1] != k:
        raise ShapeError(f"qmatmul: x must be float32 of shape (..., {k}); got {xdt} of shape "
                         f"{tuple(xs)}")
    _check_words(words, fmt, n, k, "qmatmul")
    if "rms_eps" in params:  # x normalised by the kernel (fusec.passes.quant.fold_rms_norm)
        for gs, gdt in in_types[2:]:
            if gdt != "float32" or tuple(gs) != (k,):
                raise ShapeError(f"qmatmul: a normalisation's weight must be float32 of shape "
                                 f"({k},); got {gdt} of shape {tuple(gs)}")
        if len(in_types) > 3:
            raise ShapeError("qmatmul: x, the words and at most one normalisation weight")
    elif len(in_types) != 2:
        raise ShapeError("qmatmul: two inputs, x and the words")
    return tuple(xs[:-1]) + (n,), "float32"


def dequant_numpy(words: np.ndarray, fmt: str, shape: Shape) -> np.ndarray:
    """The float32 (N, K) matrix the words hold: each value d * q (+ m) computed in float32,
    as GGUF's reference dequantisation does."""
    n, k = (int(d) for d in shape)
    nb = k // QUANT_BLOCK
    w = np.ascontiguousarray(words, dtype=np.uint32).reshape(n, nb, QUANT_WORDS[fmt])
    scales = (w[..., 0] & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
    d = scales.astype(np.float32)[..., None]
    raw = np.ascontiguousarray(w[..., 1:]).astype("<u4").view(np.uint8)  # (n, nb, bytes)
    if fmt == "q4_1":
        mins = (w[..., 0] >> np.uint32(16)).astype(np.uint16).view(np.float16)
        q = np.concatenate([raw & np.uint8(15), raw >> np.uint8(4)], axis=-1)
        vals = d * q.astype(np.float32) + mins.astype(np.float32)[..., None]
    else:
        vals = raw.view(np.int8).astype(np.float32) * d
    return vals.reshape(n, k)


def _dequant_numpy(args: Sequence[np.ndarray], params: dict[str, Any],
                   out: tuple[Shape, str]) -> np.ndarray:
    return dequant_numpy(args[0], params["fmt"], tuple(params["shape"]))


def qmatmul_numpy(args: Sequence[np.ndarray], params: dict[str, Any],
                  out: tuple[Shape, str]) -> np.ndarray:
    """The reference: x @ dequant(words).T in float32 (what the rewritten matmul computed); with
    ``rms_eps``, x is first divided by its rows' root mean square (plus eps under the root) and
    multiplied by the third input, the normalisation's weight, where there is one."""
    w = dequant_numpy(args[1], params["fmt"], (params["n"], params["k"]))
    return qmatmul_dequantized(w, args, params, out)


def qmatmul_dequantized(w: np.ndarray, args: Sequence[np.ndarray], params: dict[str, Any],
                        out: tuple[Shape, str]) -> np.ndarray:
    """:func:`qmatmul_numpy` given the words' dequantised (N, K) matrix ``w`` (the interpreter
    keeps it between calls: fusec.interpret.dequantized)."""
    x = args[0]
    rows = np.asarray(x, dtype=np.float32).reshape(-1, int(params["k"]))
    if "rms_eps" in params:
        ms = np.mean(rows * rows, axis=-1, keepdims=True, dtype=np.float32)
        rows = rows * (np.float32(1) / np.sqrt(ms + np.float32(params["rms_eps"])))
        if len(args) > 2:
            rows = rows * np.asarray(args[2], dtype=np.float32)
    return (rows @ w.T).reshape(out[0]).astype(np.float32, copy=False)


TYPE_RULES[Op.DEQUANT] = _dequant_type
NUMPY_RULES[Op.DEQUANT] = _dequant_numpy
TYPE_RULES[Op.QMATMUL] = _qmatmul_type
NUMPY_RULES[Op.QMATMUL] = qmatmul_numpy
# the words are integers: nothing to differentiate them by (x's derivative through a quantized
# product is the matmul's own rule: the program traces matmul(x, transpose(dequant(words))))
VJP_RULES[Op.DEQUANT] = lambda b, op, p, ins, outs, cts: [None]
JVP_RULES[Op.DEQUANT] = lambda b, op, p, ins, outs, tangents: [None]


def matmul_shape(a: Shape, b: Shape) -> Shape:
    """a[..., M, K] @ b[..., K, N] with equal batch dims (trace inserts broadcasts)."""
    if len(a) < 2 or len(b) < 2 or a[:-2] != b[:-2] or a[-1] != b[-2]:
        raise ShapeError(f"matmul primitive needs [...,M,K] @ [...,K,N]; got {a} and {b}")
    return a[:-1] + (b[-1],)


def infer_type(op: Op, in_types: Sequence[tuple[Shape, str]], params: dict[str, Any]
               ) -> tuple[Shape, str]:
    """Result (shape, dtype) of a primitive: the one shape/dtype rule of the IR."""
    shapes = [s for s, _ in in_types]
    dts = [d for _, d in in_types]
    if op in ELEMENTWISE or op in (Op.CAST, Op.IPOW):
        return broadcast_shapes(*shapes), elementwise_dtype(op, dts, params)
    if op in REDUCTIONS:
        return reduce_shape(shapes[0], tuple(params["axes"])), dts[0]
    if op is Op.PARTIAL:
        return reduce_shape(shapes[0], tuple(params["axes"])) + (int(params["chunks"]),), dts[0]
    if op is Op.MATMUL:
        return matmul_shape(shapes[0], shapes[1]), dts[0]
    if op is Op.RESHAPE:
        new = tuple(params["shape"])
        if math.prod(new) != math.prod(shapes[0]):
            raise ShapeError(f"cannot reshape {shapes[0]} into {new}")
        return new, dts[0]
    if op is Op.TRANSPOSE:
        perm = tuple(params["perm"])
        if sorted(perm) != list(range(len(shapes[0]))):
            raise ShapeError(
                f"transpose axes {perm} are not a permutation of {len(shapes[0])} axes")
        return tuple(shapes[0][p] for p in perm), dts[0]
    if op is Op.BROADCAST:
        new = tuple(params["shape"])
        if broadcast_shapes(shapes[0], new) != new:
            raise ShapeError(f"cannot broadcast shape {shapes[0]} to {new}")
        return new, dts[0]
    if op is Op.PAD:
        widths = tuple(params["widths"])
        if len(widths) != len(shapes[0]) or any(lo < 0 or hi < 0 for lo, hi in widths):
            raise ShapeError(f"pad widths {widths} do not fit shape {shapes[0]}")
        return tuple(lo + d + hi for d, (lo, hi) in zip(shapes[0], widths)), dts[0]
    if op is Op.SLICE:
        return slice_shape(shapes[0], tuple(params["starts"]), tuple(params["steps"]),
                           tuple(params["shape"])), dts[0]
    if op is Op.IOTA:
        shape = tuple(params["shape"])
        if not 0 <= int(params["axis"]) < len(shape):
            raise ShapeError(f"iota axis {params['axis']} is out of range for shape {shape}")
        return shape, str(params["dtype"])
    if op is Op.GATHER:
        if len(shapes) != 1 + len(shapes[0]):
            raise ShapeError(f"gather of an array of {len(shapes[0])} axes needs as many index "
                             f"arrays; got {len(shapes) - 1}")
        if any(d not in ("int32", "uint32") for d in dts[1:]):
            raise ShapeError(f"gather indices must be int32 or uint32; got {dts[1:]}")
        if 0 in shapes[0] and 0 not in broadcast_shapes(*shapes[1:]):
            raise ShapeError(f"cannot gather from an empty array of shape {shapes[0]}")
        return broadcast_shapes(*shapes[1:]), dts[0]
    rule = TYPE_RULES.get(op)
    if rule is not None:
        return rule(in_types, params)
    raise ValueError(f"no type rule for {op}")


# --- batching rules (vmap) ------------------------------------------------------------------------
# fusec.vmap traces the function for one example, then walks its equations, keeping for every
# value the axis that runs over the batch (its "batch dim", or None when the value is the same
# for every example). An equation whose operands are all unbatched is emitted as it is; otherwise
# the op's rule below emits the batched computation. A rule gets the current builder ``b`` (it
# calls ``b.bind(op, inputs, params)``; this module cannot import fusec.trace), the operands
# (tracers or Lits), their batch dims and the equation's params, and returns (result, batch dim).
# The rules are simple: most move the batch dim to axis 0 (a transpose, which fuses into the
# kernel that reads it) where that is easiest; elementwise ops, reductions and the axis-wise ops
# keep it where it is when they can.

BatchDim = Any  # int | None
BatchRule = Callable[[Any, Sequence[Any], Sequence[BatchDim], dict[str, Any]],
                     tuple[Any, BatchDim]]


def _batch_size(args: Sequence[Any], dims: Sequence[BatchDim]) -> int:
    for x, d in zip(args, dims):
        if d is not None:
            return int(x.shape[d])
    raise AssertionError("a batching rule was called with no batched operand")


def _example_rank(x: Any, d: BatchDim) -> int:
    """Rank of one example of ``x``."""
    return len(x.shape) - (d is not None)


def _move_axis(b: Any, x: Any, src: int, dst: int) -> Any:
    if src == dst:
        return x
    perm = [k for k in range(len(x.shape)) if k != src]
    perm.insert(dst, src)
    return b.bind(Op.TRANSPOSE, [x], {"perm": tuple(perm)})


def _batch_first(b: Any, x: Any, d: BatchDim, size: int) -> Any:
    """``x`` with its batch axis first; an unbatched ``x`` is broadcast along a new one."""
    if d is None:
        return b.bind(Op.BROADCAST, [x], {"shape": (size,) + tuple(x.shape)})
    return _move_axis(b, x, d, 0)


def _unit_axes_after_batch(b: Any, x: Any, rank: int) -> Any:
    """``x[n, *s]`` as ``[n, 1, ..., 1, *s]`` of 1 + ``rank`` axes: a batched operand that numpy
    broadcasting must align with the trailing axes of a per-example result of ``rank`` axes."""
    missing = rank + 1 - len(x.shape)
    if missing <= 0:
        return x
    shape = (x.shape[0],) + (1,) * missing + tuple(x.shape[1:])
    return b.bind(Op.RESHAPE, [x], {"shape": shape})


def _aligned(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], rank: int) -> list[Any]:
    """Operands of an op with numpy broadcasting (elementwise, gather and scatter indices) for a
    result of ``rank`` axes per example: batched ones get their batch axis first and unit axes up
    to 1 + rank axes; unbatched ones broadcast from the trailing axes as they are."""
    return [x if d is None else _unit_axes_after_batch(b, _move_axis(b, x, d, 0), rank)
            for x, d in zip(args, dims)]


def _elementwise_rule(op: Op) -> BatchRule:
    def rule(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
             ) -> tuple[Any, BatchDim]:
        rank = max(_example_rank(x, d) for x, d in zip(args, dims))
        at = {d for d in dims if d is not None}
        # the batch axis stays where it is when every batched operand has it there and all
        # its axes, and the unbatched operands are scalars (they broadcast along anything)
        if len(at) == 1 and all(len(x.shape) == (rank + 1 if d is not None else 0)
                                for x, d in zip(args, dims)):
            return b.bind(op, list(args), params), at.pop()
        return b.bind(op, _aligned(b, args, dims, rank), params), 0

    return rule


def _reduction_rule(op: Op) -> BatchRule:
    def rule(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
             ) -> tuple[Any, BatchDim]:
        d = dims[0]
        axes = tuple(sorted(a + (a >= d) for a in params["axes"]))
        out = b.bind(op, [args[0]], {**params, "axes": axes})
        return out, d - sum(a < d for a in axes)

    return rule


def _batch_matmul(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                  ) -> tuple[Any, BatchDim]:
    (x, y), (dx, dy) = args, dims
    size = _batch_size(args, dims)
    if dy is None and len(y.shape) == 2:
        # x[.., M, K] @ w[K, N] with the batch axis before K: one matmul of (batch x M) rows
        if dx == 2:
            x, dx = _move_axis(b, x, 2, 0), 0
        s0, s1, k = (int(s) for s in x.shape)
        rows = b.bind(Op.RESHAPE, [x], {"shape": (s0 * s1, k)})
        out = b.bind(Op.MATMUL, [rows, y], params)
        return b.bind(Op.RESHAPE, [out], {"shape": (s0, s1, int(y.shape[1]))}), dx
    x = _batch_first(b, x, dx, size)
    y = _batch_first(b, y, dy, size)
    return b.bind(Op.MATMUL, [x, y], params), 0


def _batch_reshape(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                   ) -> tuple[Any, BatchDim]:
    x = _move_axis(b, args[0], dims[0], 0)
    shape = (int(x.shape[0]),) + tuple(params["shape"])
    return b.bind(Op.RESHAPE, [x], {**params, "shape": shape}), 0


def _batch_transpose(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                     ) -> tuple[Any, BatchDim]:
    d = dims[0]
    perm = (d,) + tuple(p + (p >= d) for p in params["perm"])
    return b.bind(Op.TRANSPOSE, [args[0]], {**params, "perm": perm}), 0


def _batch_broadcast(b: Any, args: Sequence[Any], dims: Sequence[BatchDim],
                     params: dict[str, Any]) -> tuple[Any, BatchDim]:
    shape = tuple(params["shape"])
    x = _unit_axes_after_batch(b, _move_axis(b, args[0], dims[0], 0), len(shape))
    return b.bind(Op.BROADCAST, [x], {**params, "shape": (int(x.shape[0]),) + shape}), 0


def _batch_pad(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
               ) -> tuple[Any, BatchDim]:
    d = dims[0]
    widths = list(params["widths"])
    widths.insert(d, (0, 0))
    return b.bind(Op.PAD, [args[0]], {**params, "widths": tuple(widths)}), d


def _batch_slice(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                 ) -> tuple[Any, BatchDim]:
    x, d = args[0], dims[0]
    starts, steps, shape = (list(params[k]) for k in ("starts", "steps", "shape"))
    starts.insert(d, 0)
    steps.insert(d, 1)
    shape.insert(d, int(x.shape[d]))
    new = {**params, "starts": tuple(starts), "steps": tuple(steps), "shape": tuple(shape)}
    return b.bind(Op.SLICE, [x], new), d


def _batch_iota(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                ) -> tuple[Any, BatchDim]:
    # iota has no operands, so it is never batched (the walker emits it as it is); listed so
    # that the table covers every op a traced program holds
    return b.bind(Op.IOTA, list(args), params), None


def _batch_index(b: Any, size: int, rank: int) -> Any:
    """The batch coordinate 0..size-1 along axis 0 of a [size, 1, ..., 1] array of 1 + rank
    axes: the extra leading index of a gather or scatter into an operand batched on axis 0."""
    return b.bind(Op.IOTA, [], {"shape": (size,) + (1,) * rank, "axis": 0, "dtype": "int32"})


def _batch_gather(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                  ) -> tuple[Any, BatchDim]:
    size = _batch_size(args, dims)
    x, index = args[0], args[1:]
    rank = max((_example_rank(i, d) for i, d in zip(index, dims[1:])), default=0)
    index = _aligned(b, index, dims[1:], rank)
    if dims[0] is None:  # a batched index: the result [size, *S] takes its batch axis from it
        return b.bind(Op.GATHER, [x, *index], params), 0
    x = _move_axis(b, x, dims[0], 0)
    return b.bind(Op.GATHER, [x, _batch_index(b, size, rank), *index], params), 0


def _batch_scatter(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                   ) -> tuple[Any, BatchDim]:
    size = _batch_size(args, dims)
    # every example scatters into its own copy of the operand, at [example, *index]
    operand = _batch_first(b, args[0], dims[0], size)
    rest, rest_dims = args[1:], dims[1:]
    rank = max(_example_rank(x, d) for x, d in zip(rest, rest_dims))
    updates, *index = _aligned(b, rest, rest_dims, rank)
    new = [operand, updates, _batch_index(b, size, rank), *index]
    return b.bind(Op.SCATTER, new, params), 0


def _batch_cumulative(b: Any, args: Sequence[Any], dims: Sequence[BatchDim],
                      params: dict[str, Any]) -> tuple[Any, BatchDim]:
    d, axis = dims[0], int(params["axis"])
    return b.bind(Op.CUMULATIVE, [args[0]], {**params, "axis": axis + (axis >= d)}), d


def _sort_rule(op: Op) -> BatchRule:
    def rule(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
             ) -> tuple[Any, BatchDim]:
        # sorts run along the last axis, which must stay the example's last axis
        x, d = args[0], dims[0]
        if d == len(x.shape) - 1:
            x, d = _move_axis(b, x, d, 0), 0
        return b.bind(op, [x], params), d

    return rule


def _batch_searchsorted(b: Any, args: Sequence[Any], dims: Sequence[BatchDim],
                        params: dict[str, Any]) -> tuple[Any, BatchDim]:
    (a, v), (da, dv) = args, dims
    if da is None:  # one sorted array for every example: the queries' batch axis carries over
        return b.bind(Op.SEARCHSORTED, [a, v], params), dv
    # each example searches its own row: the insertion point in a sorted row is the number of
    # the row's elements before the query (< for side "left", <= for "right") in the order
    # searchsorted compares (NaN after everything, -0.0 equal to 0.0), counted as a sum
    size = _batch_size(args, dims)
    a = _move_axis(b, a, da, 0)  # [n, m]
    queries = tuple(v.shape) if dv is None else tuple(v.shape[:dv] + v.shape[dv + 1:])
    v = _batch_first(b, v, dv, size)  # [n, *Q]
    rows = b.bind(Op.RESHAPE, [a], {"shape": (size,) + (1,) * len(queries) + (a.shape[1],)})
    cols = b.bind(Op.RESHAPE, [v], {"shape": (size,) + queries + (1,)})
    dt = str(a.dtype)
    if dt == "bool":
        rows = b.bind(Op.CAST, [rows], {"dtype": "int32"})
        cols = b.bind(Op.CAST, [cols], {"dtype": "int32"})
    before = b.bind(Op.LT if params["side"] == "left" else Op.LE, [rows, cols], {})
    if dtypes.is_float(dt):
        nan_a = b.bind(Op.ISNAN, [rows], {})
        nan_v = b.bind(Op.ISNAN, [cols], {})
        if params["side"] == "left":  # a finite (or infinite) element is before a NaN query
            extra = b.bind(Op.AND, [nan_v, b.bind(Op.NOT, [nan_a], {})], {})
        else:  # every element, NaN included, is at or before a NaN query
            extra = nan_v
        before = b.bind(Op.OR, [before, extra], {})
    count = b.bind(Op.CAST, [before], {"dtype": "int32"})
    return b.bind(Op.SUM, [count], {"axes": (1 + len(queries),)}), 0


def _batch_custom_vjp(b: Any, args: Sequence[Any], dims: Sequence[BatchDim],
                      params: dict[str, Any]) -> tuple[Any, BatchDim]:
    # the marker is y itself, batched as y is; its other operands (the custom function's
    # arguments) only say what the backward function's cotangents are for. The registry entry
    # behind params["rule"] (the backward function, residuals) is batched by fusec.vmap.
    return b.bind(Op.CUSTOM_VJP, list(args), params), dims[0]


def _batch_dequant(b: Any, args: Sequence[Any], dims: Sequence[BatchDim], params: dict[str, Any]
                   ) -> tuple[Any, BatchDim]:
    # a stack of quantized matrices of one shape: dequantised as one matrix of stacked rows
    words = _move_axis(b, args[0], dims[0], 0)
    size, n, w = (int(s) for s in words.shape)
    k = int(params["shape"][1])
    rows = b.bind(Op.RESHAPE, [words], {"shape": (size * n, w)})
    out = b.bind(Op.DEQUANT, [rows], {**params, "shape": (size * n, k)})
    return b.bind(Op.RESHAPE, [out], {"shape": (size, n, k)}), 0


BATCH_RULES: dict[Op, BatchRule] = {
    # the table's rows and the two elementwise ops with params (CAST, IPOW) that have none
    **{op: _elementwise_rule(op) for op in [*ELEMENTWISE, Op.CAST, Op.IPOW]},
    **{op: _reduction_rule(op) for op in REDUCTIONS},
    Op.MATMUL: _batch_matmul,
    Op.RESHAPE: _batch_reshape,
    Op.TRANSPOSE: _batch_transpose,
    Op.BROADCAST: _batch_broadcast,
    Op.PAD: _batch_pad,
    Op.SLICE: _batch_slice,
    Op.IOTA: _batch_iota,
    Op.GATHER: _batch_gather,
    Op.SCATTER: _batch_scatter,
    Op.CUMULATIVE: _batch_cumulative,
    Op.ARGSORT: _sort_rule(Op.ARGSORT),
    Op.SORT: _sort_rule(Op.SORT),
    Op.SEARCHSORTED: _batch_searchsorted,
    Op.CUSTOM_VJP: _batch_custom_vjp,
    Op.DEQUANT: _batch_dequant,
}
