"""Kernel IR -> WGSL. Per-op expressions come from :mod:`fusec.ops`; the kernel skeletons are jinja2
templates in the top-level ``templates/`` folder (shipped in the wheel as ``fusec/templates``).

This module generates the elementwise, reduction and matmul kernels and dispatches the other kinds
(scatter, scan, sort) to :mod:`fusec.kernels`; what they share (the value emitter, bindings,
templates) is :mod:`fusec.emit`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Optional

from . import config
from .dtypes import WGSL_STORAGE, WGSL_TYPE
from .emit import (  # noqa: F401 - re-exported: part of codegen's interface
    LOOP_BUDGET,
    MAX_GROUPS,
    SOFTWARE_LOOP_LIMIT,
    WORKGROUP,
    WORKGROUP_STORAGE,
    Emitter,
    Idx,
    KernelCode,
    Unaligned,
    Window,
    _bindings,
    _env,
    _helpers,
    _nonunit,
    _template_dir,
    grid_for,
    store_expr,
    strides,
    update_window,
    window_stores,
)
from .ir import (
    COMPARISON,
    ELEMENTWISE,
    MOVEMENT,
    REDUCE,
    Eqn,
    Lit,
    Op,
    Program,
    Shape,
    Var,
    reduced_ends,
)
from .kernels import GENERATORS
from .kernels import attention as _attention
from .kernels import quant as _quant
from .kernels import sort as _sort
from .ops import REDUCTIONS, wgsl_literal

TILE = 16  # matmul tile edge
ELEMS_PER_THREAD = 4  # elementwise kernels over large arrays
VEC_MIN = 1 << 16  # elementwise kernels at least this large use vec4 loads and stores on GPUs
# vec4s per thread: on the H200 (2^26 float32) 2 gave 4.1-4.3 TB/s where 1 gave 3.2-3.6 (4: as 2)
VEC_PER_THREAD = config.env_int("FUSEC_VEC_PER_THREAD", 2)
# Register-blocked matmuls store their epilogue's runs of 4 columns as vec4s (_vector_stores).
VEC_STORES = 1
VEC_STORES_BARE_K = 4096
# row kernels on GPUs keep up to this many elements per thread in registers (FUSEC_ROW_CACHE):
# 4096x16384 softmax (rows longer than fuse.ROW_MAX: a statistics kernel, then an elementwise one)
# took 199 us on the H200 with 64, 250 us with 32 (the statistics kernel re-reading the row).
# They load single elements: runs of 4 (vec4) measured no faster on the H200 (8192x8192 softmax
# 136.7 vs 137.3 us, layer_norm 142.5 vs 137.7), nor did a two-level shared-memory combine in
# place of the tree (140.2 vs 137.6).
ROW_CACHE = config.env_int("FUSEC_ROW_CACHE", 64)
# Where the device has subgroup operations, the threads of a row kernel's row combine their
# results by subgroup shuffles (templates/combine.wgsl.j2, combine_subgroup): one barrier per
# reduction in place of a tree's 1 + log2(threads). H200, GPU us, 3 interleaved rounds,
# shuffles / tree: softmax 8192x8192 138.7-138.9 / 140.5-140.7, layer_norm 137.4-137.7 /
# 138.7-139.0, rms_norm 136.8-137.2 / 136.4-136.9, the MiniLM encoder at 32x128 2945-2948 /
# 2949-2952 (an earlier try, at the row_threads choices, had measured no gain). SUBGROUP_TYPES:
# the types subgroupShuffleXor takes.
REDUCE_SUBGROUPS = 1
SUBGROUP_TYPES = ("f32", "i32", "u32")
# Register-blocked matmul on GPUs: (BM, BN, BK, TM, TN). Measured on the H100 at 4096^3 float32
# (trusted modules, cuBLAS 50.2 TFLOP/s; ms): 128x128x16 with 8x8 per thread 4.59, BK 8 5.20, BK
# 32 5.44; 128x64x16 4.76, BK 32 4.96; 64x64x16 5.57, BK 32 5.45. A thread's 8 columns of the
# 128x128 tile as two runs of 4, 64 apart (no bank conflicts reading B) in place of 8 neighbours:
# 4.58 -> 4.53 ms; 2048^3 0.62 -> 0.59, 4096x2048x4096 2.33 -> 2.21, 8192x2048x2048 2.37 -> 2.22.
# The A tile's rows padded by one vec4 (no bank conflicts storing A): 4096^3 4.45 -> 3.97 ms,
# 4096x2048x4096 2.27 -> 2.00; 128x64 tiles 4096x1024x4096 1.27 -> 1.02, 2048x1024x2816 0.47 ->
# 0.37; 64x64 tiles 512x4096x512 (split along K) 91 -> 78 us. On devices that give a kernel
# only 16 KiB, the 128x128 and 64x64x32 tiles swizzle instead (see _a_pitch): 4096^3 4.16 ms.
# On the small tile BK = 32 was faster on every product measured (us, BK 16 / 32: 512x4096x512
# 247 / 213, 64x4096x4096 307 / 236, 100x1000x300 67 / 59, 32 x 128^3 14.7 / 13.9). The 128x128
# tile is pipelined (two sets of tiles, see _pipelined): 4096^3 3.96 -> 3.37 ms with BK 8, 3.24
# with BK 16, which it keeps where the device holds two such sets (32 KiB; BK 8 below that, see
# _fit_storage). Which tile a product gets: matmul_config.
# FUSEC_MATMUL_BLOCK="BM,BN,BK,TM,TN" forces one.
MATMUL_LARGE = (128, 128, 16, 8, 8)
LARGE_TILES = 96  # products with at least this many 128x128 tiles take them (see matmul_config)
MATMUL_MEDIUM = (128, 64, 16, 8, 4)
MATMUL_SMALL = (64, 64, 32, 4, 4)
# Products of LARGE_TILES to WIDE_TILES 128x128 tiles, which leave some of a 132-SM GPU idle,
# take 64x192 tiles (pipelined) where those number at most WIDE_TILES (see matmul_config).
MATMUL_WIDE = (64, 192, 16, 4, 12)
WIDE_TILES = 128
# Products over a short K with LARGE_TILES to THIN_TILES 128x128 tiles, on GPUs, take 64x64 tiles
# of 128 threads (8x4 each), 8 deep, pipelined: more workgroups, each filling and draining its
# pipeline sooner. K up to THIN_K where the 128x128 tiles number at most WIDE_TILES, up to
# THIN_K_MANY beyond. H200, GPU us, thin / the tile they had, best of 3 interleaved rounds
# (bench/product_probe.py; M x K x N): 4096x384x384 (wide) 46.5 / 50.0, 3072x512x512 (large)
# 54.3 / 66.6, 2048x128x1024 23.3 / 27.3, 4096x384x1536 141.8 / 157.1, 4096x256x1024 (512
# tiles) 67.2 / 69.7; the MiniLM encoder at 32x128 3243 / 3470. Left out: K 512 over more tiles
# (8192x512x768 185.6 / 191.7, but 2048x512x2048 124.9 / 118.4), and K 1536 (4096x1536x384 no
# better, 144.3 / 145.9). The same tile 16 deep: 58.9 / 169.1 / 192.2 on the first, fourth and
# 4096x1536x384; 64x128 tiles 8 deep 53.8 / 144.5 / 175.2. (cuBLAS's kernels, by CUPTI, on those
# three: 32.0, 109.7, 117.7.)
MATMUL_THIN = (64, 64, 8, 8, 4)
# On GPUs, products of 128x128 tiles take 128x192 tiles (12 columns a thread, pipelined) where those
# leave no SM more columns to compute: each SM of a GPU_SMS-SM GPU takes a share of the tiles (two
# 128x128 ones at once, or one 128x192 one: its registers), and the busiest SM's columns, its tiles'
# count times their width, bound the product's time. The wider tile does the same work about 5%
# faster (LARGE_WIDE_SPEED): its columns count that much less. H200, GPU us, bare products, 128x128
# / 128x192 (bench/product_probe.py; M x K x N: the busiest SM's columns): 2048x1024x2816 (384 /
# 384) 321 / 305, 2048x1024x3072 (384 / 384) 322 / 307, 2048x2048x2816 625 / 590, 4096x1024x2816
# (768 / 768) 627 / 594, 4096x1024x1536 (384 / 384) 322 / 306, 1024x1024x2816 (256 / 192) 214 / 155,
# and in the bench's transformer block the gate and up projections 319 / 303 and 330 / 320 (with
# SwiGLU's product in the epilogue). Left to 128x128 tiles: 3072x1024x2816 (512 / 576) 429 / 454,
# 8192x1024x2816 (1408 / 1536) 1137 / 1163, 4096^3 (1024 / 1152) 3116 / 3436, 4096x1024x4096 790 /
# 856, 2048x1024x2048 (256 / 384) 215 / 296, 4096x128x4096 134 / 146, the block's q, k, v and output
# projections 2048x1024x1024 (128 / 192) 109-115 / 150-159; its 8 x 2048x128x2048 (2048 / 2112, that
# is 2006) takes the wider tile: 272-277 / 260-265.
MATMUL_LARGE_WIDE = (128, 192, 16, 8, 12)
GPU_SMS = 132
LARGE_WIDE_SPEED = 0.95
THIN_K = 512
THIN_K_MANY = 384
THIN_TILES = 512
# Every tile pipelined where two sets fit (for probes: bench/product_probe.py).
PIPELINE_ALL = 0
MATMUL_BLOCK: Optional[tuple[int, ...]] = (
    tuple(int(v) for v in os.environ["FUSEC_MATMUL_BLOCK"].split(","))
    if os.environ.get("FUSEC_MATMUL_BLOCK") else None)


def _check_matmul_block(cfg: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """16 x (BM / TM) threads (4, 8 or 16 rows of 16), each TMxTN (positive multiples of 4),
    tiles loaded in whole rounds of a vec4 per thread; BM at least 32 (a swizzled A tile's row
    of BM / 4 vec4s takes the XOR with k % 8)."""
    if len(cfg) != 5:
        raise ValueError(f"a matmul block is BM,BN,BK,TM,TN; got {cfg}")
    bm, bn, bk, tm, tn = cfg
    ok = (tm > 0 and tn > 0 and bk > 0 and tm % 4 == 0 and tn % 4 == 0 and bm % tm == 0
          and bm // tm in (4, 8, 16) and bm >= 32 and bn == 16 * tn)
    threads = 16 * (bm // tm) if ok else 1
    if not ok or (bm * bk) % (4 * threads) or (bk * bn) % (4 * threads):
        raise ValueError(f"matmul block {cfg} does not fit 16 x (BM / TM) threads: need BM = 4, "
                         "8 or 16 TM and at least 32, BN = 16 TN, TM and TN positive multiples "
                         "of 4, BM*BK and BK*BN multiples of 4 x the threads")
    return bm, bn, bk, tm, tn


def rb_threads(cfg: tuple[int, int, int, int, int]) -> int:
    """Invocations of a register-blocked matmul's workgroup: 16 columns of BM / TM rows."""
    return 16 * (cfg[0] // cfg[3])


# How register-blocked matmuls treat an epilogue (FUSEC_MATMUL_EPILOGUE): all but "separate"
# fuse it (see epilogue_fuses). "rows" computes it from the registers one row of a thread's block
# at a time, in a loop the compiler cannot unroll (see _row_loop_epilogue); "direct" computes it
# from the registers as straight-line code, every element of the block at once; "auto" is "rows"
# on the gpu target for an epilogue with an op outside PLAIN_EPILOGUE_OPS, "direct" otherwise;
# "staged" computes it through workgroup memory, a band of rows at a time; "separate" leaves it to
# an elementwise kernel of its own. A bare product is stored straight from the registers.
MATMUL_EPILOGUE = os.environ.get("FUSEC_MATMUL_EPILOGUE", "auto")
if MATMUL_EPILOGUE not in ("auto", "rows", "staged", "direct", "separate"):
    raise ValueError("FUSEC_MATMUL_EPILOGUE must be auto, rows, staged, direct or separate; "
                     f"got {MATMUL_EPILOGUE}")
# Ops of a few plain instructions each: an epilogue of these alone (a bias, relu, a residual, a
# scale) is computed straight-line under "auto", which measured as fast or faster than the row
# loop there (H200, GPU us, with a bias, rows / direct, 2 rounds: 2048x1024x2816 on 128x192 tiles
# 305-307 / 299-300, 4096x384x1536 on the thin tile 140-141 / 138; H100 4096^3 3090-3099 /
# 3085-3094). Any other op (exp, a division, tanh, ...) takes the row loop (_row_loop_epilogue).
PLAIN_EPILOGUE_OPS = MOVEMENT | COMPARISON | {
    Op.NEG, Op.ABS, Op.ADD, Op.SUB, Op.MUL, Op.MAX, Op.MIN, Op.WHERE, Op.CAST, Op.COPY,
    Op.STOP_GRADIENT, Op.AND, Op.OR, Op.XOR, Op.NOT, Op.SIGN, Op.SIGNBIT, Op.ISNAN, Op.ISINF,
    Op.ISFINITE}
# Products with at most GEMV_M rows and at least 256 columns on GPUs: a thread per column, all rows
# in registers, A staged GEMV_K_TILE values of K at a time (FUSEC_GEMV=0: the 16x16 kernel).
GEMV = os.environ.get("FUSEC_GEMV", "1") != "0"
GEMV_M = 16
GEMV_K_TILE = 256
# ...and a B of at least GEMV_MIN_KN elements: with a smaller B its few workgroups (one per 256
# columns and chunk of K) leave the GPU idle, and the 16x16 kernel is faster. H200, GPU us,
# few-row / 16x16 kernel (both split along K; bench/product_probe.py), M x K x N:
# 16x384x384 21.8 / 11.4, 16x1536x384 21.8 / 12.2, 16x384x1536 22.7 / 12.4, 4x1024x1024 17.4 /
# 12.3; but 16x2048x2048 22.0 / 26.2, 8x1024x8192 24.7 / 43.8, 8x4096x4096 44.3 / 81.2,
# 1x576x49152 41.1 / 129.6. The MiniLM-L6 encoder at 1x16: 1975 / 976 us for the whole call.
GEMV_MIN_KN = 1 << 21
# loads of B each thread has in flight (divides GEMV_K_TILE). On the H100, 8x4096 @ 4096x4096
# took 104 us with 1, 72 with 4, 71 with 8 or 16 (torch 61); 1x4096 @ 4096x4096 82, 46, 46 (46).
GEMV_UNROLL = 8
GEMV_FIT_K = 1  # a K shorter than GEMV_K_TILE takes a tile of its length (see _matmul_gemv)
# Tried and dropped (H100, 2026-12-07, bench/product_probe.py --plain, GPU us, 2 interleaved
# rounds, a column a thread / four read as one vec4, 64 threads a workgroup): 8x4096x4096 39.3-39.7
# / 41.4, 1x4096x4096 31.7-31.9 / 39.1, 1x576x49152 45.0-50.0 / 51.6-54.9, 8x1024x8192 20.4 /
# 21.0-22.2, 4x4096x11008 75.8 / 75.8; only 16x2048x2048 gained (25.3 / 21.3-21.9).
assert GEMV_K_TILE % GEMV_UNROLL == 0, "the K tile is walked in whole steps of GEMV_UNROLL"
# Products with few columns (see use_fewcol) and at least FEWCOL_M rows (times the batch) on GPUs:
# a row per few threads walking K (fewcol_lanes), B staged FEWCOL_K_TILE rows at a time, each
# thread with FEWCOL_K_TILE / lanes loads of A in flight (FUSEC_FEWCOL=0: the 16x16 kernel, split
# along K). Others take the 16x16 kernel split along K, which with trusted shader modules runs
# these products in 75-90 us on the H100 whatever N (see use_fewcol for the table).
FEWCOL = os.environ.get("FUSEC_FEWCOL", "1") != "0"
FEWCOL_M = 1024
FEWCOL_K_TILE = 256
# Products with FEWCOL4_MIN_N to FEWCOL4_MAX_N columns, a K (times the batch) of at least
# FEWCOL4_MIN_K and at least FEWCOL_M rows, on GPUs, whose A is read as vec4s
# along K (see _a_source): FEWCOL4_LANES threads side by side on a row of A, FEWCOL4_ROWS rows per
# thread, B staged FEWCOL4_K_TILE rows at a time where workgroup memory allows
# (FUSEC_FEWCOL4=0: as before, the 16x16 kernel). H200, 4096x4096 @ 4096x8 cut along K into 8
# chunks, GPU us without the sum's kernel (bench/fewcol_proto.py, 3 rounds; reading A once
# took 17.8-18.0): lanes 4, rows 2 27.6-28.3; lanes 2, rows 2 30.9-31.6; lanes 8, rows 4
# 29.0-30.0; lanes 8, rows 1 46.0; 16 and 32 lanes 64-463. B read straight from memory instead of
# staged: 31.2 at best, 43-80 mostly. The 16x16 kernel cut into 16 chunks took 44 (47 with the sum).
# But those are dispatches back to back, whose tails overlap: one dispatch alone took 45.6 (28
# more for a second one behind it), and in a call, with the sum, the product took as long as on
# the 16x16 kernel. Calls, GPU us, this template / the 16x16 kernel (H200, product_probe.py):
# 4096x4096x8 46.8 / 46.3, 16384x2048x8 77.8 / 173.3 (the 16x16 kernel not cut: 1024 tiles),
# 2048x8192x12 54.5 / 64.3, 1024x4096x10 21.7 / 23.3; but 4096x4096x5 41.3 / 36.3 and
# 4096x4096x16 85.1 / 81.9, so 8 to 12 columns only.
FEWCOL4 = os.environ.get("FUSEC_FEWCOL4", "1") != "0"
FEWCOL4_MIN_N = 8
FEWCOL4_MAX_N = 12
FEWCOL4_MIN_K = 2048
FEWCOL4_LANES = 4
FEWCOL4_ROWS = 2
FEWCOL4_K_TILE = 512
# Of those, products with 8 columns and ROWK_MIN_M rows or more, or 12 columns and ROWK_MIN_M_WIDE
# rows or more, whose A and B both read as vec4s (see use_rowk), take matmul_rowk in one
# dispatch, K whole: threads side by side on a row walk all of K (about ROWK_STEPS vec4s of a
# row each, between ROWK_MIN_LANES and ROWK_MAX_LANES threads), each thread ROWK_ROWS rows
# (ROWK_FEW_ROWS below ROWK_MANY_ROWS_M rows), B's rows read straight from memory as vec4s.
# H100, GPU us of one dispatch, that kernel / the chunks of matmul_fewcol4 without their sum
# (bench/fewcol_proto.py --single, 2026-12-07, 2 rounds): 4096x4096 @ 4096x8 43.2 (64 lanes, 8
# rows) / 53.4-54.0; 2048x8192 @ 8192x12 50.7-50.8 (128 lanes, 4 rows) / 79.9-80.8; 3000x4096 @
# 4096x12 41.8 (64 lanes, 4 rows) / 75.4; 16384x2048 @ 2048x8 81.1 (32 lanes, 8 rows) / 86.7;
# but 2048x4096 @ 4096x8 25.6 at best (128 lanes, 8 rows) / 23.3, and 1024x4096 @ 4096x8 19.0
# at best / 20.7. Calls with the sum (bench/product_probe.py, 2 rounds): 4096x4096x8 38.6 /
# 51.8-52.6, 2048x8192x12 47.7-47.8 / 61.8, 3000x4096x12 38.8-39.0 / 54.2, 4096x8192x8 77.4-77.6
# / 86.6-86.7, 16384x2048x8 84.0-84.4 / 87.5, 2048x2048x8 19.7-19.9 / 21.0-21.2, but 2048x4096x8
# 26.1-26.2 / 22.4, hence 8 columns from 4096 rows only. With fewer rows a thread, B's reads
# bound it (4096x4096 @ 4096x8, 32 lanes: 1 row 144, 2 rows 79, 4 rows 50).
ROWK = os.environ.get("FUSEC_ROWK", "1") != "0"
ROWK_MIN_M = 4096
ROWK_MIN_M_WIDE = 2048
ROWK_STEPS = 16
ROWK_MIN_LANES = 32
ROWK_MAX_LANES = 256
ROWK_ROWS = 8
ROWK_FEW_ROWS = 4
ROWK_MANY_ROWS_M = 4096
ROWK_THREADS = 128
# threads per row of row kernels on GPUs (FUSEC_ROW_THREADS forces one; default: see row_threads)
ROW_THREADS = config.env_int("FUSEC_ROW_THREADS", 0)
ROW_PER_THREAD = 16  # elements per thread row_threads aims at
# loads each thread of a partial-reduction kernel has in flight per loop step (FUSEC_PARTIAL_UNROLL)
# (sum of 2^26 float32 on the H200: 120 us with 1, 73 with 4 to 16; 2^22 x 16 column sums: 927
# with 8, 715 with 16)
PARTIAL_UNROLL = config.env_int("FUSEC_PARTIAL_UNROLL", 16)
if PARTIAL_UNROLL < 1:
    raise ValueError(f"FUSEC_PARTIAL_UNROLL must be at least 1; got {PARTIAL_UNROLL}")
# partial reductions over leading axes take a thread per (chunk, column) from this many columns
# on (a workgroup per (column, chunk) below), and split_reductions then aims at 2^18 threads.
# Column sums of 2^26 float32 on the H100 (copy of the same bytes: 184 us), this way against a
# workgroup per (column, chunk) of at most 1024 chunks: 16 columns 106 against 730 us, 8 144
# against 696, 4 195 against 351, but 2 275 against 179 and 1 616 against 97
PARTIAL_COLUMNS_MIN = 4
# ...but up to this many columns (FUSEC_FLAT_COLUMNS, at most a workgroup; 0: never), on GPUs,
# the partial kernel reads its chunk of rows as one contiguous run, a workgroup per chunk (see
# partial_layout). Column sums on the H100 (us, this way against the two above; a full sum of the
# same bytes beside it): 2^26 float32 in 2 columns 95.8 / 179.7 (full 96.3), 3 105.2 / 278.2, 4
# 96.2 / 145.6, 7 103.7 / 132.4, 8 95.7 / 117.9, 16 96.0 / 104.8, 64 96.6 / 98.9, 128 96.9 /
# 100.4, 200 106.8 / 106.6, 256 98.4 / 97.7; 2^24 in 4 columns 30.9 / 52.4 (full 31.1), 2^22
# 11.1 / 14.6 (11.1), 2^20 12.4 / 14.6 (11.3)
FLAT_COLUMNS = config.env_int("FUSEC_FLAT_COLUMNS", 128)
if not 0 <= FLAT_COLUMNS <= WORKGROUP:
    raise ValueError(f"FUSEC_FLAT_COLUMNS must be from 0 to {WORKGROUP}; got {FLAT_COLUMNS}")


def tuning() -> dict[str, Any]:
    """Every setting that changes generated code: part of the persistent cache's key."""
    return {"workgroup": WORKGROUP, "tile": TILE, "elems": ELEMS_PER_THREAD, "vec_min": VEC_MIN,
            "vec_per": VEC_PER_THREAD, "row_cache": ROW_CACHE, "row_threads": ROW_THREADS,
            "reduce_subgroups": REDUCE_SUBGROUPS,
            "partial_unroll": PARTIAL_UNROLL, "flat_columns": FLAT_COLUMNS,
            "gemv": (GEMV, GEMV_M, GEMV_MIN_KN, GEMV_K_TILE, GEMV_UNROLL, GEMV_FIT_K),
            "fewcol": (FEWCOL, FEWCOL_M, FEWCOL_K_TILE),
            "fewcol4": (FEWCOL4, FEWCOL4_MIN_N, FEWCOL4_MAX_N, FEWCOL4_MIN_K, FEWCOL4_LANES,
                        FEWCOL4_ROWS, FEWCOL4_K_TILE),
            "rowk": (ROWK, ROWK_MIN_M, ROWK_MIN_M_WIDE, ROWK_STEPS, ROWK_MIN_LANES,
                     ROWK_MAX_LANES, ROWK_ROWS, ROWK_FEW_ROWS, ROWK_MANY_ROWS_M, ROWK_THREADS),
            "first_index": FIRST_INDEX,
            "matmul": (MATMUL_BLOCK, MATMUL_LARGE, MATMUL_MEDIUM, MATMUL_SMALL, MATMUL_EPILOGUE,
                       LARGE_TILES, MATMUL_WIDE, WIDE_TILES, MATMUL_LARGE_WIDE, GPU_SMS,
                       LARGE_WIDE_SPEED, MATMUL_THIN, THIN_K,
                       THIN_K_MANY, THIN_TILES, PIPELINE_ALL, VEC_STORES,
                       VEC_STORES_BARE_K),
            "attention": (_attention.ROWS, _attention.SPLIT, _attention.MAX_TILE,
                          _attention.MAX_HEAD, _attention.FEW_ROWS, _attention.FEW_HEAD,
                          _attention.FEW_KEYS, _attention.FEW_THREADS, _attention.FEW_UNROLL,
                          _attention.CHUNK, _attention.STAGE_BIAS, _attention.VEC_STORES,
                          _attention.PART_KEYS, _attention.MAX_PARTS,
                          _attention.COMBINE_THREADS, _attention.ROW_SUBGROUPS),
            "quant": (_quant.QMATMUL_M, _quant.WORKGROUP, _quant.MAX_TEAM, _quant.UNROLL,
                      _quant.CPU_ROWS, _quant.TEAM_UNITS),
            "sort": (_sort.LOCAL_MAX, _sort.RADIX_PER_THREAD, _sort.RADIX_BLOCKS,
                     _sort.HIST_UNROLL, _sort.WLMS_SUBGROUP_MIN)}


def generate(kernel: Eqn, target: str = "gpu",
             workgroup_storage: int = WORKGROUP_STORAGE) -> KernelCode:
    """WGSL for one ``kernel`` equation produced by the fusion pass. ``target`` is "gpu", or "cpu"
    for a software adapter (lavapipe), where a thread per row beats a workgroup per row;
    ``workgroup_storage``: the bytes of workgroup memory the device gives a kernel."""
    return _enable_f16(_generate(kernel, target, workgroup_storage))


_F16_TYPE = re.compile(r"\bf16\b")


def _enable_f16(code: KernelCode) -> KernelCode:
    """``code`` with WGSL's ``enable f16;`` first where it names the type f16 (float16 storage):
    a shader without it may not, and one with it needs the device feature shader-f16."""
    if not _F16_TYPE.search(code.wgsl):
        return code
    wgsl = "enable f16;\n" + code.wgsl
    return dataclasses.replace(code, wgsl=wgsl, key=hashlib.sha256(wgsl.encode()).hexdigest())


def _generate(kernel: Eqn, target: str, workgroup_storage: int) -> KernelCode:
    kind = kernel.params["kind"]
    if kind in GENERATORS:
        return GENERATORS[kind](kernel, target, workgroup_storage)
    body: Program = kernel.params["body"]
    name = kernel.params["name"]
    inplace = tuple(kernel.params.get("inplace", ()))
    window = (update_window(body, inplace) if kind == "elementwise" and UPDATE_WINDOW
              else None)
    vec: set[str] = set()
    if kind == "elementwise" and target == "gpu" and window is None:
        vec = _vector_buffers(body, inplace)
    elif kind == "matmul":
        vec = _matmul_vector_buffers(body, inplace, target, workgroup_storage)
    binds, names = _bindings(body, inplace, vec)
    if window is not None:
        wgsl, groups = _elementwise_window(body, names, window)
    elif kind == "elementwise":
        wgsl, groups = (_elementwise_vec4(body, names, vec) if vec
                        else _elementwise(body, names, target))
    elif kind == "reduce":
        wgsl, groups = _reduce(body, names, target, bool(kernel.params.get("subgroups")))
    else:
        wgsl, groups = _matmul(body, names, target, workgroup_storage, vec)
    header = _env().get_template("bindings.wgsl.j2").render(bindings=binds)
    full = header + _helpers(wgsl) + wgsl
    key = hashlib.sha256(full.encode()).hexdigest()  # the WGSL is a pure function of the kernel IR
    return KernelCode(name, kind, full, grid_for(groups), len(body.inputs) - len(inplace),
                      len(body.outputs), key=key)


def _kernel_shape(outs: list[Var]) -> Shape:
    """An elementwise kernel's shape: its outputs', or the largest where 0-d side outputs ride
    along (loop bodies: fusec.passes.fuse's scalar_sides); any other mix is not generated."""
    shape = max((o.shape for o in outs), key=lambda s: (math.prod(s), len(s)))
    if any(o.shape not in (shape, ()) for o in outs):
        raise Unaligned(f"elementwise outputs of shapes {[o.shape for o in outs]}")
    return shape


def _elementwise(body: Program, names: dict[int, str], target: str = "gpu") -> tuple[str, int]:
    outs = [o for o in body.outputs if isinstance(o, Var)]
    shape = _kernel_shape(outs)
    n = math.prod(shape)
    # large arrays on a GPU: several elements per thread (each a coalesced pass over the
    # workgroup's block), so that more loads are in flight per thread. A software adapter already
    # runs invocations as SIMD lanes: one element each.
    big = n >= ELEMS_PER_THREAD * WORKGROUP * 64
    per = ELEMS_PER_THREAD if big and target == "gpu" else 1
    em = Emitter(body, names, indent="        ")
    idx = Idx(shape, flat="gid")
    stores = []
    for j, o in enumerate(outs):
        if o.shape == shape:
            stores.append(f"        out{j}[gid] = {store_expr(em.value(o, idx), o.dtype)};")
        else:  # a 0-d side output: the first thread writes it
            v = store_expr(em.value(o, Idx((), flat="0u")), o.dtype)
            stores.append(f"        if (gid == 0u) {{ out{j}[0] = {v}; }}")
    src = _env().get_template("elementwise.wgsl.j2").render(
        wg=WORKGROUP, n=n, per=per, body="\n".join(em.lines), stores="\n".join(stores))
    return src, -(-n // (WORKGROUP * per))


# An in-place update's kernel runs over its window alone (see emit.update_window); 0: over the
# whole buffer, as before (bench/llama_synthetic.py --settings "default;codegen.UPDATE_WINDOW=0").
UPDATE_WINDOW = 1


def _elementwise_window(body: Program, names: dict[int, str], window: Window
                        ) -> tuple[str, int]:
    """An in-place update over its window alone (see emit.update_window): a thread per element
    of the window (threads that fall outside the array, where a start is not clamped, do
    nothing)."""
    lines, stores, n = window_stores(body, names, window, range(len(body.outputs)), "return",
                                     "        ")
    src = _env().get_template("elementwise.wgsl.j2").render(
        wg=WORKGROUP, n=n, per=1, body="\n".join(lines), stores="\n".join(stores))
    return src, -(-n // WORKGROUP)


def _vector_buffers(body: Program, inplace: tuple[tuple[int, int], ...]) -> set[str]:
    """Buffers an elementwise kernel reads and writes as vec4 arrays: those with as many elements
    as the output, when that is a multiple of 4 and large enough to matter."""
    outs = [o for o in body.outputs if isinstance(o, Var)]
    n = math.prod(outs[0].shape)
    if n % 4 or n < VEC_MIN or any(o.shape != outs[0].shape for o in outs):
        return set()
    aliased = dict(inplace)
    vec = {f"out{j}" for j in range(len(outs))}
    vec |= {f"in{i}" for i, v in enumerate(body.inputs) if v.size == n and i not in aliased}
    return vec


def _elementwise_vec4(body: Program, names: dict[int, str], vec: set[str]) -> tuple[str, int]:
    """Each thread computes 4 consecutive elements: one 16-byte load per vectorised input, the
    lanes computed with the scalar expressions, one 16-byte store per output."""
    outs = [o for o in body.outputs if isinstance(o, Var)]
    shape = outs[0].shape
    n = math.prod(shape)
    em = Emitter(body, names, indent="        ")
    em.vec_buffers = vec
    lanes = []
    for lane in range(4):
        flat = em.let(f"4u * t + {lane}u", "e")
        em.lane_of[flat] = ("t", lane)
        lanes.append([em.value(o, Idx(shape, flat=flat)) for o in outs])
    stores = []
    for j, o in enumerate(outs):
        vt = f"vec4<{WGSL_STORAGE[o.dtype]}>"
        parts = ", ".join(store_expr(lanes[lane][j], o.dtype) for lane in range(4))
        stores.append(f"        out{j}[t] = {vt}({parts});")
    groups = -(-(n // 4) // (WORKGROUP * VEC_PER_THREAD))
    src = _env().get_template("elementwise_vec4.wgsl.j2").render(
        wg=WORKGROUP, n4=n // 4, per=VEC_PER_THREAD, body="\n".join(em.lines),
        stores="\n".join(stores))
    return src, groups


def reduce_strategy(n_out: int, r: int, last_axis_reduced: bool, target: str = "gpu") -> str:
    """'workgroup' (a workgroup per output, tree reduction in shared memory) or 'thread' (a thread
    per output, sequential loop). On a GPU threads win when outputs are many and rows short or
    strided; on a software adapter barriers are expensive and a thread walking a contiguous row is
    what a CPU does best, so threads win as soon as there are rows enough for every core."""
    if target == "cpu":
        return "thread" if n_out >= 64 else "workgroup"
    if n_out < 2048 or (last_axis_reduced and r >= 64):
        return "workgroup"
    return "thread"


FIRST_INDEX = 1  # argmax / argmin as one pass of (value, index) pairs (see _first_index)


def _first_index(body: Program, reds: list[Eqn]) -> Optional[str]:
    """The helper that orders (value, index) pairs (``fusec_argmax_f32`` ...) where the kernel's
    reductions are argmax's or argmin's two, as fusec.numpy traces them: m = max (min) of x along
    one axis, then the least index i with x[i] == m, or isnan(x[i]) for floats. Both then come
    from one pass over the row, each thread keeping its best (value, index) pair (its elements
    come in increasing index, so a later equal value never replaces an earlier one), and one
    combine across the threads. The second reduction's own pass (its arithmetic, and a second
    combine's barriers) cost more than the first: rows of 8192x8192 float32 on the H200, max
    alone 66 us, argmax in two passes 102.4-103.1, in one pass of pairs 79.6-79.7 (3 interleaved
    rounds, bench/workload_probe.py)."""
    if not FIRST_INDEX or len(reds) != 2:
        return None
    e0, e1 = reds
    axes = tuple(e0.params["axes"])
    x = e0.inputs[0]
    if (e0.op not in (Op.RMAX, Op.RMIN) or e1.op is not Op.RMIN or len(axes) != 1
            or e1.out.dtype != "int32" or not isinstance(x, Var)
            or x.dtype not in ("float32", "float16", "int32", "uint32")):
        return None
    producer = {id(o): e for e in body.eqns for o in e.outs}

    def made(v: Any, op: Op) -> Optional[Eqn]:
        e = producer.get(id(v)) if isinstance(v, Var) else None
        return e if e is not None and e.op is op else None

    pick = made(e1.inputs[0], Op.WHERE)
    if pick is None:
        return None
    hit, iota, sentinel = pick.inputs
    iota_eqn = made(iota, Op.IOTA)
    if (iota_eqn is None or iota_eqn.params["axis"] != axes[0] or not isinstance(sentinel, Lit)
            or sentinel.value != x.shape[axes[0]]):
        return None
    if x.dtype in ("float32", "float16"):  # where(isnan(x), True, x == m)
        either = made(hit, Op.WHERE)
        if (either is None or not isinstance(either.inputs[1], Lit)
                or either.inputs[1].value is not True):
            return None
        nan = made(either.inputs[0], Op.ISNAN)
        if nan is None or nan.inputs[0] is not x:
            return None
        hit = either.inputs[2]
    eq = made(hit, Op.EQ)
    if eq is None or eq.inputs[0] is not x:
        return None
    m = eq.inputs[1]
    kept = made(m, Op.RESHAPE)
    if m is not e0.out and (kept is None or kept.inputs[0] is not e0.out):
        return None
    return f"fusec_arg{'max' if e0.op is Op.RMAX else 'min'}_{WGSL_TYPE[x.dtype]}"


def _reduce(body: Program, names: dict[int, str], target: str = "gpu",
            subgroups: bool = False) -> tuple[str, int]:
    """A row kernel: every reduction of the body runs over the same rows, one after another, each
    result held in a register for the rest of the kernel; then row-shaped outputs are computed in a
    last pass over the row, and per-row outputs once. One workgroup (or thread) owns a row.
    ``subgroups``: the device has subgroup operations (the fusion pass's ``subgroups``); the
    threads of a row then combine their results through them (see REDUCE_SUBGROUPS)."""
    reds = [e for e in body.eqns if e.op in REDUCE or e.op is Op.PARTIAL]
    first = reds[0]
    src0 = first.inputs[0]
    shape, axes = src0.shape, tuple(first.params["axes"])
    for e in reds[1:]:
        if (e.inputs[0].shape != shape or tuple(e.params["axes"]) != axes
                or (e.op is Op.PARTIAL) != (first.op is Op.PARTIAL)
                or e.params.get("chunks") != first.params.get("chunks")):
            raise Unaligned("reductions over different rows cannot share a kernel")
    if first.op is Op.PARTIAL:
        if {id(o) for o in body.outputs} != {id(e.out) for e in reds}:
            raise Unaligned("a partial-reduction kernel stores only its partial results")
        return _partial(body, names, reds, target)
    kept = [k for k in range(len(shape)) if k not in axes]
    out_shape = tuple(shape[k] for k in kept)
    n_out = math.prod(out_shape)
    r = math.prod(shape[k] for k in axes)
    leading, trailing = reduced_ends(len(shape), axes)
    strategy = reduce_strategy(n_out, r, bool(axes) and axes[-1] == len(shape) - 1, target)
    threads = row_threads(r) if strategy == "workgroup" and target == "gpu" else WORKGROUP
    rows_per_group = WORKGROUP // threads

    # per-thread register cache of the row: a fixed number of elements per thread, unrolled
    per_thread = -(-r // threads)
    cached = strategy == "workgroup" and target == "gpu" and trailing and per_thread <= ROW_CACHE
    row_cache: dict[int, tuple[str, str, int]] = {}
    indent = "            "
    # passes over the row that are loops (not unrolled from the register cache): one per
    # reduction and one for row-shaped outputs; each thread's loop steps by ``step``
    step = threads if strategy == "workgroup" else 1
    row_pass = any(isinstance(o, Var) and o.shape == shape for o in body.outputs)
    copies = 1 if cached else loop_copies(
        target, len(reds) + row_pass, -(-r // step),
        len(reds) * (threads.bit_length() - 1) if strategy == "workgroup" else 0)

    def loop(inner: str) -> str:
        """A loop over this thread's elements of the row, each running ``inner`` (which reads
        the element's index as ``r``): ``copies`` elements per iteration."""
        start = "t" if strategy == "workgroup" else "0u"
        if copies == 1:
            return (f"    for (var r = {start}; r < {r}u; r += {step}u) {{\n        {{\n{inner}\n"
                    "        }\n    }")
        blocks = [f"        {{\n            let r = r0;\n{inner}\n        }}"]
        blocks += [f"        if (r0 + {c * step}u < {r}u) {{\n"
                   f"            let r = r0 + {c * step}u;\n{inner}\n        }}"
                   for c in range(1, copies)]
        return (f"    for (var r0 = {start}; r0 < {r}u; r0 += {copies * step}u) {{\n"
                + "\n".join(blocks) + "\n    }")

    def stage_emitter() -> Emitter:
        em = Emitter(body, names, indent=indent, registers=registers, counter=counter)
        em.memo.update(prelude.memo)
        if cached:
            em.row_cache, em.row_shape = row_cache, shape
        return em

    def unrolled(stage: int, emit: Callable[[Emitter, Idx], list[str]]) -> str:
        """The pass over this thread's part of the row, one block per element (constant register
        indices keep the cached row in registers)."""
        blocks = []
        for jj in range(per_thread):
            em = stage_emitter()
            em.stage, em.row_slot = stage, str(jj)
            idx = row_index(em, f"{jj * threads}u + t")
            em.row_flat = idx.flat
            tail = emit(em, idx)
            guard = (jj + 1) * threads > r
            blocks.append(("    if (t + {0}u < {1}u) {{\n".format(jj * threads, r) if guard
                           else "    {\n") + "\n".join(em.lines + tail) + "\n    }")
        return "\n".join(blocks)

    counter = [0]
    prelude = Emitter(body, names, indent="    ", counter=counter)
    outer = prelude.coords(Idx(out_shape, flat="o"))
    held = _nonunit(outer, out_shape)
    registers: dict[int, tuple[tuple[str, ...], str]] = {}

    def row_index(em: Emitter, rr: str = "r") -> Idx:
        if rr != "r":
            rr = em.let(rr, "r")
        rc = em.coords(Idx(tuple(shape[k] for k in axes), flat=rr))
        coords = [""] * len(shape)
        for k, c in zip(kept, outer):
            coords[k] = c
        for k, c in zip(axes, rc):
            coords[k] = c
        flat = (em.let(f"o * {r}u + {rr}", "i") if n_out > 1 else rr) if trailing else (
            em.let(f"{rr} * {n_out}u + o", "i") if n_out > 1 else rr) if leading else None
        return Idx(shape, flat=flat, coords=tuple(coords))

    out_index = {id(o): j for j, o in enumerate(body.outputs)}
    # argmax / argmin: the index reduction rides on the value reduction's pass (_first_index)
    take = _first_index(body, reds)
    sub = bool(REDUCE_SUBGROUPS) and subgroups and strategy == "workgroup" and target == "gpu"
    stages = []
    for k, e in enumerate(reds):
        info = REDUCTIONS[e.op]
        dt = e.out.dtype
        acc = f"acc{k}"

        def update(val: str, idx: Idx, acc: str = acc, info: Any = info, dt: str = dt) -> str:
            """The accumulator's step with the element ``val`` at ``idx``."""
            if take is None:
                return f"{indent}{acc} = {info.combine(acc, val, dt)};"
            assert idx.coords is not None, "row_index names every coordinate"
            at = f"i32({idx.coords[axes[0]]})"
            return (f"{indent}if ({take}({acc}, acc1, {val}, {at})) {{\n{indent}    {acc} = {val};"
                    f"\n{indent}    acc1 = {at};\n{indent}}}")

        if take is not None and k == 1:  # the pairs' index: computed by stage 0
            code = val = ""
        elif cached:
            def emit(em: Emitter, idx: Idx, e: Eqn = e,
                     update: Callable[[str, Idx], str] = update) -> list[str]:
                return [update(em.value(e.inputs[0], idx), idx)]

            code, val = unrolled(k, emit), ""
        else:
            em = stage_emitter()
            idx = row_index(em)
            val = em.value(e.inputs[0], idx)
            code = "\n".join(em.lines) + "\n" + update(val, idx)
        stages.append({
            "acc": acc, "ty": WGSL_TYPE[dt], "identity": wgsl_literal(info.identity(dt), dt),
            "body": code, "cached": cached, "loop": "" if cached else loop(code),
            "shared": f"sdata{k}",
            "combine_shared": info.combine(f"sdata{k}[lid]", f"sdata{k}[lid + s]", dt),
            "combine_fn": lambda a, b, info=info, dt=dt: info.combine(a, b, dt),
            "sub": sub and take is None and WGSL_TYPE[dt] in SUBGROUP_TYPES,
            "result": f"red{k}", "after": "", "take": take if k == 0 else "",
            "skip": take is not None and k == 1})
        registers[id(e.out)] = (held, f"red{k}")
        if take is not None and k == 0:  # both results are known after this stage
            registers[id(reds[1].out)] = (held, "red1")
        stages[-1]["after"] = _hoist(body, names, registers, held, out_shape, prelude.memo,
                                     counter)

    row_outs = [o for o in body.outputs if isinstance(o, Var) and id(o) not in registers
                and o.shape == shape and n_out * r > 0]
    def emit_row(em: Emitter, ridx: Idx) -> list[str]:
        flat = em.flat(ridx)
        return [f"{indent}out{out_index[id(ro)]}[{flat}] = "
                f"{store_expr(em.value(ro, ridx), ro.dtype)};" for ro in row_outs]

    row_em = stage_emitter()
    row_stores: list[str] = []
    row_body = ""
    if row_outs and cached:
        row_body = unrolled(len(reds), emit_row)
        row_stores = ["// stored above"]
    elif row_outs:
        row_stores = emit_row(row_em, row_index(row_em))
        row_body = "\n".join(row_em.lines)
    row_ids = {id(o) for o in row_outs}
    scalar_em = Emitter(body, names, indent="        ", registers=registers, counter=counter)
    scalar_em.memo.update(prelude.memo)
    scalar_stores = []
    for o in body.outputs:
        assert isinstance(o, Var)
        if id(o) in row_ids:
            continue
        if o.size != n_out:
            raise Unaligned(f"output of shape {o.shape} is neither a row nor a per-row value")
        v = scalar_em.value(o, Idx(o.shape, flat="o"))
        scalar_stores.append(f"        out{out_index[id(o)]}[o] = {store_expr(v, o.dtype)};")
    groups = -(-n_out // (rows_per_group if strategy == "workgroup" else WORKGROUP))
    src = _env().get_template("reduce.wgsl.j2").render(
        strategy=strategy, wg=WORKGROUP, n_out=n_out, r=r, stages=stages, threads=threads,
        rows_per_group=rows_per_group, groups=groups,
        any_sub=any(st["sub"] for st in stages),
        row_loop=loop(f"{row_body}\n" + "\n".join(row_stores)) if row_stores and not cached
        else "", per_thread=per_thread,
        caches=[{"name": n, "ty": t} for n, t, _ in row_cache.values()],
        prelude="\n".join(prelude.lines), row_body=row_body, cached=cached,
        row_stores="\n".join(row_stores), scalar_body="\n".join(scalar_em.lines),
        scalar_stores="\n".join(scalar_stores))
    return src, groups


def loop_copies(target: str, passes: int, iterations: int, fixed: int = 0) -> int:
    """Copies of a loop's body per iteration (a power of two) that keep a kernel for the "cpu"
    target within LOOP_BUDGET loop iterations per invocation: ``passes`` loops of ``iterations``
    each, plus ``fixed`` iterations of other loops. 1 on the "gpu" target."""
    copies = 1
    while target == "cpu" and passes * -(-iterations // copies) + fixed > LOOP_BUDGET:
        copies *= 2
    return copies


def row_threads(r: int) -> int:
    """Threads per row of a row kernel on a GPU: a power of two from 32 to a workgroup, about one
    per ROW_PER_THREAD elements; a workgroup holds WORKGROUP // threads rows.

    Softmax over 2^26 float32 on the H200 (copy of the same bytes: 130 us), by row length and
    threads per row: 256 long, 32 threads 133 us, 256 threads 784; 1024 long, 64 threads 136, 256
    threads 259; 2048 long, 128 threads 136, 256 threads 145; 8192 long, 256 threads 138, 512
    threads 137, 1024 threads 209. (The threads' combine: see REDUCE_SUBGROUPS.)
    """
    if ROW_THREADS:
        if ROW_THREADS & (ROW_THREADS - 1) or not 1 <= ROW_THREADS <= WORKGROUP:
            raise ValueError(f"FUSEC_ROW_THREADS must be a power of two up to {WORKGROUP}; "
                             f"got {ROW_THREADS}")
        return ROW_THREADS
    want = -(-r // ROW_PER_THREAD)
    return min(WORKGROUP, max(32, 1 << (want - 1).bit_length()))


def _hoist(body: Program, names: dict[int, str], registers: dict[int, tuple[tuple[str, ...], str]],
           held: tuple[str, ...], out_shape: Shape, memo: dict[tuple[Any, ...], str],
           counter: list[int]) -> str:
    """Compute once per row, right after a reduction, the values that depend only on the row's
    reductions so far (mean = sum / n, rsqrt(var + eps), ...), and hold them in registers."""
    lines: list[str] = []
    row_dims = tuple(d for d in out_shape if d != 1)
    for e in body.eqns:
        if len(e.outs) != 1 or id(e.out) in registers or e.op in REDUCE or e.op is Op.PARTIAL:
            continue
        if e.op is Op.MATMUL or tuple(d for d in e.out.shape if d != 1) != row_dims:
            continue
        if not all(isinstance(a, Lit) or id(a) in registers for a in e.inputs):
            continue
        it = iter(held)
        coords = tuple("0u" if d == 1 else next(it) for d in e.out.shape)
        em = Emitter(body, names, indent="    ", registers=registers, counter=counter)
        em.memo.update(memo)
        try:
            name = em.value(e.out, Idx(e.out.shape, coords=coords))
        except Unaligned:
            continue
        lines.extend(em.lines)
        registers[id(e.out)] = (_nonunit(coords, e.out.shape), name)
    return "\n".join(lines)


def partial_layout(leading: bool, trailing: bool, n_out: int, target: str) -> str:
    """How the first stage of a split reduction (``reduce_partial``) reads its chunks (asked by the
    split pass too, which sizes the chunks to match):

    - "flat": over leading axes only, at most FLAT_COLUMNS columns, GPU target: a workgroup per
      chunk of rows, read as one contiguous run of elements; a thread takes every T-th element,
      T a multiple of the column count, so all it reads is of one column, and a warp's loads are
      neighbours. Column sums then run as fast as a full sum of the same bytes (see FLAT_COLUMNS);
      the two layouts below took up to 2.9x as long with 2-8 columns, where each warp's loads
      were scattered over many rows.
    - "columns": over leading axes, from PARTIAL_COLUMNS_MIN columns: a thread per (chunk, column),
      neighbouring threads on neighbouring columns.
    - "rows": the rest: a workgroup per (row, chunk)."""
    if target == "gpu" and leading and not trailing and n_out <= FLAT_COLUMNS:
        return "flat"
    if leading and not trailing and n_out >= PARTIAL_COLUMNS_MIN:
        return "columns"
    return "rows"


def _partial(body: Program, names: dict[int, str], parts: list[Eqn],
             target: str) -> tuple[str, int]:
    """First stage of a multi-stage reduction: chunk g of row o into one partial result per
    reduction in ``parts`` (all over the same rows and chunks: each element is read once for all
    of them), laid out as ``partial_layout`` says."""
    e = parts[0]
    src = e.inputs[0]
    shape, axes, chunks = src.shape, tuple(e.params["axes"]), int(e.params["chunks"])
    kept = [k for k in range(len(shape)) if k not in axes]
    out_shape = tuple(shape[k] for k in kept)
    n_out = math.prod(out_shape)
    r = math.prod(shape[k] for k in axes)
    size = -(-r // chunks)
    layout = partial_layout(*reduced_ends(len(shape), axes), n_out, target)
    em = Emitter(body, names, indent="            ")
    if layout == "flat":
        # leading axes reduced: the source's flat index is row * n_out + column
        idx = Idx(shape, flat="r")
    else:
        oc = em.coords(Idx(out_shape, flat="o"))
        rc = em.coords(Idx(tuple(shape[k] for k in axes), flat="r"))
        coords = [""] * len(shape)
        for k, c in zip(kept, oc):
            coords[k] = c
        for k, c in zip(axes, rc):
            coords[k] = c
        idx = Idx(shape, coords=tuple(coords))
    # "flat": threads lid < stride read (stride a multiple of the columns); then the threads of
    # each column combine theirs in a tree over lid / n_out, a level (a distance) per step
    stride = WORKGROUP // n_out * n_out
    levels: list[int] = []
    if layout == "flat":
        s = 1 << max(0, (stride // n_out - 1).bit_length() - 1)
        while stride > n_out and s >= 1:
            levels.append(s * n_out)
            s //= 2
    out_index = {id(o): j for j, o in enumerate(body.outputs)}
    accs = []
    for k, p in enumerate(parts):
        info = REDUCTIONS[Op(p.params["reduce"])]
        dt = p.out.dtype
        acc, shared = f"acc{k}", f"sdata{k}"
        accs.append({
            "acc": acc, "shared": shared, "total": f"total{k}", "ty": WGSL_TYPE[dt],
            "identity": wgsl_literal(info.identity(dt), dt), "out": f"out{out_index[id(p.out)]}",
            "combine": info.combine(acc, em.value(p.inputs[0], idx), dt),
            "combine_shared": info.combine(f"{shared}[lid]", f"{shared}[lid + s]", dt),
            "level_combine": [info.combine(f"{shared}[lid]", f"{shared}[lid + {d}u]", dt)
                              for d in levels],
            "store": store_expr(f"total{k}", dt), "store_acc": store_expr(acc, dt)})
    code = _env().get_template("partial.wgsl.j2").render(
        layout=layout, unroll=PARTIAL_UNROLL, stride=stride, levels=levels, accs=accs,
        wg=WORKGROUP, n_out=n_out, r=r, chunks=chunks, size=size, body="\n".join(em.lines))
    if layout == "columns":
        return code, -(-n_out * chunks // WORKGROUP)
    return code, chunks if layout == "flat" else n_out * chunks


def matmul_config(m: int, n: int, target: str, k: int = 0, batch: int = 1
                  ) -> Optional[tuple[int, int, int, int, int]]:
    """(BM, BN, BK, TM, TN) of the register-blocked template for a product of ``batch`` times
    (M x K) @ (K x N), or None for the 16x16 baseline.

    The large tile wherever there are enough of them to fill the GPU. Measured on the H100
    (trusted modules, pipelined 128x128 tile, B read as vec4s; ms, bare product on the large /
    128x64 / 64x64 tile; batch x M x N x K): 4096^3 3.24 / 3.89 / 4.93; 4096x4096x1024 0.89 /
    0.97 / 1.17; 4096x1024x4096 0.83 / 1.23 / 1.25; 2048^3 0.43 / 0.61 / 0.61; 2048x2816x1024
    0.36 / 0.36 / 0.48; 2048x1024x2816 (128 tiles) 0.33 / 0.37 / 0.43; 2048x1024x1024 (128) 0.11
    / 0.13 / 0.15; 8x2048x128x2048 (128) 0.23 / 0.29 / 0.33; 8x2048x2048x128 0.29 / 0.29 / 0.33;
    but 1024^3 (64 tiles) 0.11 / 0.08 / 0.08. At 96 tiles (the MiniLM encoder's products at batch
    32x128), large / 128x64: 4096x384x1536 0.166 / 0.193, 4096x384x384 0.055 / 0.058."""
    # software adapters too: on lavapipe the register-blocked tiles run 5-12x faster than the
    # 16x16 baseline (888x384 @ 384x1536: 149 against 1810 ms; 256^3 9.5 against 58 ms; the
    # MiniLM encoder at 24x37: 6.5 against 43.5 s), as long as their one runtime loop (over K, in
    # steps of 16 or more) stays within the software adapter's loop budget
    if m < 32 or n < 32 or target == "cpu" and -(-k // 16) > LOOP_BUDGET:
        return None
    if MATMUL_BLOCK is not None:
        return _check_matmul_block(MATMUL_BLOCK)
    if m < 128 or n < 128:
        return _check_matmul_block(MATMUL_SMALL)
    tiles = batch * -(-m // 128) * -(-n // 128)
    if target == "gpu" and LARGE_TILES <= tiles <= THIN_TILES and 0 < k <= (
            THIN_K if tiles <= WIDE_TILES else THIN_K_MANY):
        return _check_matmul_block(MATMUL_THIN)
    wide = batch * -(-m // MATMUL_WIDE[0]) * -(-n // MATMUL_WIDE[1])
    if LARGE_TILES <= tiles < WIDE_TILES and wide <= WIDE_TILES:
        return _check_matmul_block(MATMUL_WIDE)
    if tiles >= LARGE_TILES:
        if target == "gpu" and _fills_sms_better(m, n, batch, tiles):
            return _check_matmul_block(MATMUL_LARGE_WIDE)
        return _check_matmul_block(MATMUL_LARGE)
    return _check_matmul_block(MATMUL_MEDIUM if tiles >= 64 else MATMUL_SMALL)


def _fills_sms_better(m: int, n: int, batch: int, tiles: int) -> bool:
    """Do 128x192 tiles leave the busiest SM no more columns to compute than the ``tiles``
    128x128 ones (see MATMUL_LARGE_WIDE)?"""
    bm, bn = MATMUL_LARGE_WIDE[:2]
    wide = batch * -(-m // bm) * -(-n // bn)
    return (LARGE_WIDE_SPEED * -(-wide // GPU_SMS) * bn
            <= -(-tiles // GPU_SMS) * MATMUL_LARGE[1])


def mm_config(mm: Eqn, target: str) -> Optional[tuple[int, int, int, int, int]]:
    """``matmul_config`` of the product computed by equation ``mm``."""
    _, _, _, m, k, n, nb = _mm_dims(mm)
    return matmul_config(m, n, target, k, nb)


def epilogue_fuses(mm: Eqn, target: str) -> bool:
    """May an elementwise epilogue fuse into the kernel of matmul ``mm``? (Asked by the fusion
    pass.) Yes unless FUSEC_MATMUL_EPILOGUE is "separate". On the pipelined 128x128 tile an
    epilogue computed from the registers costs the main loop nothing measurable, where a kernel of
    its own costs a round trip of the product through memory (H100, ms, bare / fused from the
    registers / staged / own kernel: 4096^3 + bias + gelu 3.25 / 3.26 / 3.37 / 3.29; 4096x4096x1024
    + bias + gelu 0.887 / 0.889 / 0.906 / 0.936; 4096x1024x4096 + bias 0.830 / 0.831 / 0.866 /
    0.845; 4096x1024x1024 + bias + relu 0.236 / 0.236 / 0.240 / 0.250). (The single-buffered
    kernel before it was slowed erratically by an epilogue, a bias alone by 50%.)"""
    if mm_config(mm, target) is None:
        return True
    return MATMUL_EPILOGUE != "separate"


def large_tile(cfg: tuple[int, int, int, int, int]) -> bool:
    """Is ``cfg`` (a ``matmul_config``) a tile as large as MATMUL_LARGE?"""
    return cfg[0] * cfg[1] >= MATMUL_LARGE[0] * MATMUL_LARGE[1]


def _epilogue_values(body: Program, mm: Eqn, ee: Emitter, here: Idx) -> list[str]:
    """The values of a matmul kernel's outputs at ``here``, computed where the product's register
    lives (the statements before them go to ``ee.lines``)."""
    vals = []
    for o in body.outputs:
        assert isinstance(o, Var)
        if o.shape != mm.out.shape:
            raise Unaligned("a matmul epilogue output must have the product's shape")
        vals.append(store_expr(ee.value(o, here), o.dtype))
    return vals


def _epilogue_stores(body: Program, mm: Eqn, ee: Emitter, here: Idx) -> list[str]:
    """Stores of a matmul kernel's outputs, computed where the product's register lives."""
    return [f"        out{j}[{here.flat}] = {v};"
            for j, v in enumerate(_epilogue_values(body, mm, ee, here))]


def _batch_coords(em: Emitter, batch: list[int]) -> tuple[str, ...]:
    """The batch coordinates of flat batch index ``bt``."""
    return tuple(em.coords(Idx(tuple(batch), flat="bt"))) if batch else ()


def _epilogue_here(mm: Eqn, ee: Emitter, bc: tuple[str, ...], row: str, col: str,
                   product: str) -> Idx:
    """The index of C[bt, row, col] (batch coordinates ``bc``), whose product is held in
    ``product``."""
    *_, m, n = mm.out.shape
    here = Idx(mm.out.shape, flat=ee.let(f"(bt * {m}u + {row}) * {n}u + {col}", "i"),
               coords=bc + (row, col))
    ee.registers[id(mm.out)] = (_nonunit(bc + (row, col), mm.out.shape), product)
    return here


def _epilogue_at(body: Program, mm: Eqn, ee: Emitter, bc: tuple[str, ...], row: str,
                 col: str, product: str) -> list[str]:
    """The epilogue's stores for C[bt, row, col] (batch coordinates ``bc``), whose product is
    held in ``product``; the statements before them go to ``ee.lines``."""
    return _epilogue_stores(body, mm, ee, _epilogue_here(mm, ee, bc, row, col, product))


def _mm_dims(mm: Eqn) -> tuple[Var, Var, list[int], int, int, int, int]:
    """Operands, batch dims, M, K, N and batch size of a matmul equation."""
    a, b = mm.inputs
    assert isinstance(a, Var) and isinstance(b, Var)
    *batch, m, k = a.shape
    return a, b, batch, m, k, b.shape[-1], math.prod(batch)


def _operand(body: Program, names: dict[int, str], x: Var, batch: list[int],
             at: tuple[str, str], indent: str, counter: list[int]) -> tuple[str, str]:
    """The statements loading matmul operand ``x`` at (batch ``bt``, ``at``), and its value."""
    em = Emitter(body, names, indent=indent, counter=counter)
    val = em.value(x, Idx(x.shape, coords=_batch_coords(em, batch) + at))
    return "\n".join(em.lines), val


def _operand_path(producer: dict[int, Eqn], x: Var) -> tuple[Var, list[Eqn]]:
    """The value matmul operand ``x`` is read from through movement equations only (broadcasts,
    reshapes, transposes and split_k's pads), and those equations, from ``x`` back to it.
    ``producer``: each value's defining equation, by id (an Emitter's ``producer``)."""
    src, path = x, list[Eqn]()
    while id(src) in producer and len(path) < 4:
        e = producer[id(src)]
        if e.op not in MOVEMENT or not isinstance(e.inputs[0], Var):
            break
        path.append(e)
        src = e.inputs[0]
    return src, path


def _reshape_strides(shape: Shape, st: Sequence[int], new: Shape) -> Optional[list[int]]:
    """Strides of a reshape to ``new`` of a view with ``shape`` and strides ``st``, where the
    reshape only regroups runs of axes that are contiguous with each other; None otherwise."""
    old = [(d, s) for d, s in zip(shape, st) if d != 1]
    out = [0] * len(new)
    i = j = 0
    while j < len(new):
        if new[j] == 1:
            j += 1
            continue
        if i >= len(old):
            return None
        # one group: old axes i..i2-1 and new axes j..j2-1 of the same size
        po, pn, i2, j2 = old[i][0], new[j], i + 1, j + 1
        while po != pn:
            if po < pn and i2 < len(old):
                po, i2 = po * old[i2][0], i2 + 1
            elif pn < po and j2 < len(new):
                pn, j2 = pn * new[j2], j2 + 1
            else:
                return None
        if any(old[a][1] != old[a + 1][1] * old[a + 1][0] for a in range(i, i2 - 1)):
            return None
        step = old[i2 - 1][1]
        for a in range(j2 - 1, j - 1, -1):
            out[a] = step
            step *= new[a]
        i, j = i2, j2
    return out if i == len(old) else None


def view_strides(src: Var, path: Sequence[Eqn]) -> Optional[tuple[int, ...]]:
    """Strides, in elements of ``src``'s flat index, of the value that the movement equations
    ``path`` (as _operand_path lists them: the last reads ``src``) make of ``src``; None where
    one of them is not a strided view of it (a pad, or a reshape that would need a copy)."""
    shape, st = src.shape, list(strides(src.shape))
    for e in reversed(path):
        out = e.out.shape
        if e.op is Op.TRANSPOSE:
            st = [st[p] for p in e.params["perm"]]
        elif e.op is Op.BROADCAST:
            lead = len(out) - len(shape)
            st = [0] * lead + [0 if d == 1 else s for d, s in zip(shape, st)]
        elif e.op is Op.RESHAPE:
            got = _reshape_strides(shape, st, out)
            if got is None:
                return None
            st = got
        else:
            return None
        shape = out
    return tuple(st)


def _strided_index(em: Emitter, here: Idx, st: Sequence[int]) -> str:
    """The flat index of element ``here`` of a strided view (strides ``st``)."""
    cs = em.coords(here)
    terms = [f"{c} * {s}u" if s != 1 else c
             for c, s, d in zip(cs, st, here.shape) if d != 1 and s != 0]
    return em.let(" + ".join(terms) if terms else "0u", "i")


def _padded_chunks(src: Var, path: Sequence[Eqn], b: Var) -> bool:
    """Is ``b`` split_k's reshape into chunks of K of ``src`` padded with zero rows?"""
    if [e.op for e in path] != [Op.RESHAPE, Op.PAD]:
        return False
    return (len(src.shape) == 2 and len(b.shape) == 3 and src.shape[1] == b.shape[2]
            and path[1].params["widths"] == ((0, path[1].out.shape[0] - src.shape[0]), (0, 0)))


def _b_source(body: Program, mm: Eqn) -> Optional[Var]:
    """The input buffer matmul ``mm`` reads B from, if B can be read as vec4s (four adjacent
    columns in one 16-byte load; 4096x4096 @ 4096x1024 on the H100's 128x64 tile: 0.96 against
    1.02 ms): a strided view of an input (through reshapes, transposes and broadcasts: split_k's
    chunks of K, a batch broadcast, attention's heads) whose rows are runs of B's columns that
    start on a vec4, or split_k's chunks of an input padded with zero rows; one that nothing else
    in the kernel reads. Unpadded, the vec4s win on every tile (H100, us, vec4 / scalar:
    64x100000x1024 489 / 519, 64x4096x4096 93 / 97, 2048x2816x1024 322 / 330); for a padded B
    see _b_vec_index."""
    a, b, batch, m, k, n, nb = _mm_dims(mm)
    if n % 4 or b.dtype == "bool":
        return None
    producers = {id(o): e for e in body.eqns for o in e.outs}
    src, path = _operand_path(producers, b)
    if not _padded_chunks(src, path, b) and not _vec4_runs(view_strides(src, path), b.shape):
        return None
    # A read from the same input (x @ x.reshape(..), or A on B's own path) reads it as scalars
    if _operand_path(producers, a)[0] is src:
        return None
    return src if _read_only_through(body, mm, b, src, path) else None


def _vec4_runs(st: Optional[tuple[int, ...]], shape: Shape) -> bool:
    """Are the last axis's elements of a view with strides ``st`` contiguous runs that start on a
    vec4 (every other stride a multiple of 4)?"""
    return st is not None and st[-1] == 1 and not any(
        s % 4 for s, d in zip(st[:-1], shape) if d != 1)


def _read_only_through(body: Program, mm: Eqn, x: Var, src: Var, path: Sequence[Eqn]) -> bool:
    """Is input ``src`` read by matmul ``mm`` as its operand ``x``, through the movement
    equations ``path``, and by nothing else in the kernel (so that its binding may be vec4s),
    with neither it nor ``x`` an output?"""
    if not any(v is src for v in body.inputs) or any(o is src or o is x for o in body.outputs):
        return False
    readers = [mm, *path]
    between = [src, x, *(e.out for e in path)]
    return not any(any(y is v for v in between) for e in body.eqns
                   if not any(e is r for r in readers) for y in e.inputs)


def _a_source(body: Program, mm: Eqn) -> Optional[Var]:
    """The input buffer matmul ``mm`` reads A from, if A can be read as vec4s along K (for the
    few-column template, _matmul_fewcol4): float32, a strided view of an input (through reshapes,
    transposes and broadcasts: split_k's chunks of K) in which K runs contiguously and every other
    stride, and K, are multiples of 4; one that nothing else in the kernel reads, and no output."""
    a, b, batch, m, k, n, nb = _mm_dims(mm)
    if k % 4 or a.dtype != "float32" or b.dtype != "float32" or mm.out.dtype != "float32":
        return None
    producers = {id(o): e for e in body.eqns for o in e.outs}
    src, path = _operand_path(producers, a)
    if not _vec4_runs(view_strides(src, path), a.shape) or _operand_path(producers, b)[0] is src:
        return None
    return src if _read_only_through(body, mm, a, src, path) else None


def _runs_along(body: Program, x: Var, axis: int) -> bool:
    """Is operand ``x`` a strided view of an input in which ``axis`` (-2 or -1) runs contiguously
    and the other of its last two axes does not?"""
    src, path = _operand_path({id(o): e for e in body.eqns for o in e.outs}, x)
    if not any(v is src for v in body.inputs) or x.shape[axis] == 1:
        return False
    st = view_strides(src, path)
    return st is not None and st[axis] == 1 and st[-3 - axis] != 1


def _b_columns(body: Program, mm: Eqn) -> bool:
    """Is B a view in which K runs contiguously (``x @ w.T``, attention's ``q @ k^T``)? Then
    threads load the B tile the way they load A's, neighbouring threads at neighbouring k, so
    that their reads are coalesced."""
    return _runs_along(body, _mm_dims(mm)[1], -2)


def _a_rows(body: Program, mm: Eqn) -> bool:
    """Is A a view in which M runs contiguously (``x.T @ y``)? Then neighbouring threads load
    neighbouring rows of the A tile at one k, not neighbouring k of a row."""
    return _runs_along(body, _mm_dims(mm)[0], -2)


def _b_vec_index(em: Emitter, b: Var, here: Idx, branch: bool) -> tuple[str, str]:
    """The flat index into the input B is read from (see _b_source) of element ``here`` of B,
    and a condition for the read ("" for none).

    Past the end of a padded B the read must give zero. With ``branch`` (the pipelined tile) the
    read is skipped there; without, the row is clamped into B and the value read is selected
    away. H100, us, branch / select / scalar reads: the pipelined large tile 512x20011x512 267 /
    349 / 307, 128x50257x512 185 / 244 / 217, 200x30001x300 307 / 298 / 630; the smaller tiles
    64x100003x1024 606 / 488 / 519, 96x9001x2048 226 / 190 / 200, 4096x4097x64 106 / 97 / 103,
    1000x7001x128 120 / 112 / 111.

    The pipelined tile also reads an unpadded B behind a test of the index against B's size,
    which always holds: measured, the test makes the kernel faster, though we do not know why
    (the driver's compiler schedules the loop differently). H100, us, without / with:
    4096^3 3236 / 3123, 4096x1024x4096 870 / 813, 4096x4096x1024 824 / 800, 2048^3 427 / 419;
    split along K: 512x20016x512 300 / 272, 2048x2816x1024 324 / 301, 1000x4096x1000 259 /
    245. The same kind of test around the A tile's reads made it slower (4096^3 3.10 -> 3.50
    ms)."""
    src, path = _operand_path(em.producer, b)
    if not _padded_chunks(src, path, b):
        st = view_strides(src, path)
        assert st is not None, "_b_source reads only strided views as vec4s"
        at = _strided_index(em, here, st)
        return at, f"{at} < {src.size}u" if branch else ""
    # the padded array's (row, col)
    coords = em.grouped_coords(here, path[0].inputs[0].shape, merges_only=True)
    assert coords is not None, "split_k's reshape only cuts K into chunks"
    row, col = coords
    inside = row if branch else em.let(f"min({row}, {src.shape[0] - 1}u)", "c")
    return em.let(f"{inside} * {src.shape[1]}u + {col}", "i"), f"{row} < {src.shape[0]}u"


def _matmul_vector_buffers(body: Program, inplace: tuple[tuple[int, int], ...],
                           target: str, workgroup_storage: int = WORKGROUP_STORAGE) -> set[str]:
    """The bindings a matmul kernel reads and writes as vec4s: on the register-blocked template
    the input it reads B from (see _b_source), and its outputs where its epilogue stores straight
    from the registers four adjacent columns at a time (see _vector_stores); on matmul_rowk A's
    and B's (_rowk_vectors), on matmul_fewcol4 A's (_a_source); none on the few-row template.
    Never an input written in place."""
    mm = next(e for e in body.eqns if e.op is Op.MATMUL)
    _, _, _, m, k, n, nb = _mm_dims(mm)
    aliased = dict(inplace)

    def inputs(srcs: Sequence[Optional[Var]]) -> set[str]:
        return {f"in{i}" for i, v in enumerate(body.inputs)
                if any(v is x for x in srcs) and i not in aliased}

    cfg = matmul_config(m, n, target, k, nb)
    if cfg is None:
        if use_gemv(m, n, target, k * nb):
            return set()
        if use_rowk(m, n, k, nb, target) and _rowk_views(body, mm) is not None:
            return inputs(list(_rowk_vectors(body, mm)))
        if use_fewcol4(m, n, k, nb, target):
            return inputs([_a_source(body, mm)])
        return set()
    vec = inputs([_b_source(body, mm)])
    if _vector_stores(body, mm, _fit_storage(cfg, workgroup_storage), aliased):
        vec |= {f"out{j}" for j in range(len(body.outputs))}
    return vec


def _vector_stores(body: Program, mm: Eqn, cfg: tuple[int, int, int, int, int],
                   aliased: dict[int, int]) -> bool:
    """Does the epilogue store each run of a thread's four adjacent columns as one vec4? Where it
    stores from the registers (not staged), N is a multiple of 4 (a run starts on a vec4 and lies
    wholly inside C or wholly outside), and no output is also read as an input (written in place)
    or boolean. One 16-byte store where there were four 4-byte ones: a warp's store covers whole
    32-byte sectors. H200, GPU us, 3 interleaved rounds, 4-byte / vec4 stores: with a bias,
    4096x8x384 13.3-13.9 / 7.4-7.5, 4096x384x384 44.8-45.6 / 39.8-40.3, 4096x1536x384
    146.4-146.8 / 137.1-139.3, 2048x1024x2816 336.3-336.7 / 313.8-315.4, 4096^3 3117-3126 /
    3088-3094; bare, 2048x1024x2816 334 / 321-322 (both on the 128x128 tile). Except the bare
    4096^3 product: 3115-3122 / 3247-3248, though the same kernel with a bias was faster. Bare
    products on the 128x128 tile over a K of VEC_STORES_BARE_K or more keep their 4-byte stores
    (a bound measured at those two points only)."""
    *_, n = mm.out.shape
    *_, k = mm.inputs[0].shape
    bare = len(body.outputs) == 1 and body.outputs[0] is mm.out
    return (bool(VEC_STORES) and n % 4 == 0 and not _staged_rows(body, cfg)
            and not (bare and large_tile(cfg) and k >= VEC_STORES_BARE_K) and not aliased
            and all(isinstance(o, Var) and o.shape == mm.out.shape and o.dtype != "bool"
                    for o in body.outputs))


def deferred_prologue(m: int, k: int, n: int, batch: int, target: str,
                      workgroup_storage: int) -> bool:
    """Would a product of ``batch`` times (M x K) @ (K x N) take a pipelined kernel, the one that
    computes an elementwise A a step behind its loads (_deferred_a)? (Elsewhere A's arithmetic
    waits for its loads: attention's probabilities computed so cost more than writing them.)"""
    cfg = matmul_config(m, n, target, k, batch)
    return cfg is not None and _pipelined(_fit_storage(cfg, workgroup_storage), workgroup_storage)


def _deferred_a(body: Program, mm: Eqn) -> Optional[tuple[Var, list[Var]]]:
    """Where product ``mm``'s A is elementwise work computed in the kernel (a prologue:
    attention's probabilities, ``exp(s * scale - max)``; passes/attention.py), the one value of
    A's shape it reads from memory (the scores) and the values constant along K it reads (one
    per row: the rows' maxima), else None; all float32. A pipelined kernel then loads the
    scores into its prefetch registers as it would load A, two steps of K ahead, loads the
    per-row values once, and computes A from both at the top of the step before the one that
    uses them (their loads have arrived; the results wait in registers through the step's
    products) and stores it at that step's end. Computed where it is loaded, the arithmetic
    waited for the load, and exposed the latency the prefetch hides (H200, the bench
    transformer's p @ v: 381 us, against 216 with A written out; computed where the tile is
    stored, after the step's products, 285 us, as the store waited for it; a step behind, see
    passes/attention.py)."""
    producers = {id(o): e for e in body.eqns for o in e.outs}
    a = mm.inputs[0]
    assert isinstance(a, Var)
    if (a.dtype != "float32" or mm.out.dtype != "float32" or id(a) not in producers
            or producers[id(a)].op not in ELEMENTWISE):
        return None
    row_shape = a.shape[:-1] + (1,)
    full: dict[int, Var] = {}
    rows: dict[int, Var] = {}
    stack = [a]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if v.shape != a.shape and v.shape != row_shape:
            return None
        e = producers.get(id(v))
        if v is not a and (e is None or e.op not in ELEMENTWISE):
            # read from memory (or through movement ops): full, or one value per row
            if v.dtype != "float32":
                return None
            (full if v.shape == a.shape else rows)[id(v)] = v
            continue
        assert e is not None
        if id(e) not in seen:
            seen.add(id(e))
            stack.extend(x for x in e.inputs if isinstance(x, Var))
    if len(full) != 1 or len(rows) > 2:
        return None
    return next(iter(full.values())), list(rows.values())


def _matmul_rb(body: Program, names: dict[int, str], mm: Eqn,
               cfg: tuple[int, int, int, int, int], workgroup_storage: int,
               vec: set[str], target: str) -> tuple[str, int]:
    cfg = _fit_storage(cfg, workgroup_storage)
    bm, bn, bk, tm, tn = cfg
    pipelined = _pipelined(cfg, workgroup_storage)
    ap = _a_pitch(cfg, workgroup_storage, 2 if pipelined else 1)
    a, b, batch, m, k, n, nb = _mm_dims(mm)
    tn_tiles, tm_tiles = -(-n // bn), -(-m // bm)
    counter = [0]
    indent = "                    "

    # each thread loads groups of 4: four rows of A at one k, four columns of B at one k
    threads = rb_threads(cfg)
    # whole rounds of a vec4 per thread (_check_matmul_block)
    a_groups, b_groups = bm * bk // (4 * threads), bk * bn // (4 * threads)
    load_a: list[list[str]] = []
    val_a: list[list[str]] = []
    load_b: list[list[str]] = []
    val_b: list[list[str]] = []
    deferred = _deferred_a(body, mm) if pipelined else None
    loaded = deferred[0] if deferred is not None else a  # what the prefetch loads
    for _ in range(a_groups):
        pairs = [_operand(body, names, loaded, batch, ("row", "ka"), indent, counter)
                 for _ in range(4)]
        load_a.append([p[0] for p in pairs])
        val_a.append([p[1] for p in pairs])
    row_loads, a_from = (_deferred_parts(body, names, mm, deferred, a_groups, bk, counter)
                         if deferred is not None else ([], []))
    # the input bound as vec4s for B (_matmul_vector_buffers), if any
    src = next((v for v in body.inputs if names.get(id(v)) in vec), None)
    bvec = names[id(src)] if src is not None else ""
    # a float16 B's vec4<f16> (8 bytes) widened to the vec4<f32> the tiles hold
    bwiden = "vec4<f32>" if src is not None and src.dtype == "float16" else ""
    load_bv: list[str] = []
    at_bv: list[str] = []
    guard_bv: list[str] = []
    for _ in range(b_groups):
        if src is not None:  # one vec4 load at the flat index of B[bt, kb, col]
            em = Emitter(body, names, indent=indent, counter=counter)
            here = Idx(b.shape, coords=_batch_coords(em, batch) + ("kb", "col"))
            at, guard = _b_vec_index(em, b, here, branch=pipelined)
            at_bv.append(at)
            guard_bv.append(guard)
            load_bv.append("\n".join(em.lines))
            continue
        pairs = [_operand(body, names, b, batch, ("kb", "col"), indent, counter)
                 for _ in range(4)]
        load_b.append([p[0] for p in pairs])
        val_b.append([p[1] for p in pairs])
    loads = dict(a_loads=a_groups, b_loads=b_groups, load_a=load_a, val_a=val_a, load_b=load_b,
                 val_b=val_b, vec_b=bool(bvec), bvec=bvec, bwiden=bwiden, load_bv=load_bv,
                 at_bv=at_bv, guard_bv=guard_bv, guard_branch=pipelined, pipelined=pipelined, ap=ap,
                 row_loads=row_loads, a_from=a_from, row_vals=len(deferred[1]) if deferred else 0,
                 b_cols=not bvec and _b_columns(body, mm), a_rows=_a_rows(body, mm))
    staged = _staged_rows(body, cfg)
    if staged:
        rounds, rr = tm // staged, staged
        per_thread = ((bm // tm) * staged * bn // 4) // threads
        lanes = []
        for lane in range(4):
            ee = Emitter(body, names, indent="            ", counter=counter)
            c = ee.let(f"ec + {lane}u", "c")
            stores = _epilogue_at(body, mm, ee, _batch_coords(ee, batch), "er", c, f"s4[{lane}]")
            lanes.append("        {\n" + "\n".join(ee.lines) + f"\n            if (er < {m}u && "
                         f"{c} < {n}u) {{\n" + "\n".join("        " + st for st in stores)
                         + "\n            }\n        }")
        return _render_rb(mm, cfg, m, n, k, tm_tiles, tn_tiles, nb, loads, epilogue="",
                          rounds=rounds, rr=rr, per_thread=per_thread, lanes="\n".join(lanes))
    mode = MATMUL_EPILOGUE
    if mode == "auto":
        mode = "rows" if target == "gpu" and _special_epilogue(body, mm) else "direct"
    if mode == "rows" and len(body.eqns) > 1:
        return _render_rb(mm, cfg, m, n, k, tm_tiles, tn_tiles, nb, loads,
                          epilogue=_row_loop_epilogue(body, names, mm, cfg, m, n, batch, vec,
                                                      counter, WGSL_TYPE[mm.out.dtype]),
                          rounds=0, rr=0, per_thread=0, lanes="")
    # The epilogue, once per element of the thread's block, where its accumulator lives. One
    # emitter for the whole block: what depends only on the row or the column (a bias) is loaded
    # once per row or column, not once per element.
    ee = Emitter(body, names, indent="    ", counter=counter)
    rows = [ee.let(f"row0 + ty * {tm}u + {i}u", "r") for i in range(tm)]
    cols = _thread_cols(ee, tn)
    bc = _batch_coords(ee, batch)
    blocks = []
    vec_out = "out0" in vec
    # A bare product whose rows and columns are whole tiles stores without the bounds test (it
    # always holds): NVIDIA's compiler then builds a faster kernel (H100, GPU us, tested /
    # not, 3 rounds: 4096^3 3118-3120 / 3066-3067, 4096x4096 @ 4096x1024 797-798 / 785-786;
    # 4096x1024 @ 1024x4096, 2048x1024 @ 1024x1024 and 2048^3 unchanged). With an epilogue it
    # built a slower one (4096^3 + bias 3073-3106 / 3109-3135, + bias + gelu 3158-3159 /
    # 3193-3198, the bench MLP 1560 / 1590), so the test stays there.
    unguarded = m % bm == 0 and n % bn == 0 and len(body.eqns) == 1
    for i in range(tm):
        for j in range(0, tn, 4 if vec_out else 1):
            r, c = rows[i], cols[j]
            stores = _block_stores(body, mm, ee, bc, r, cols, j, vec_out, f"acc{i}_")
            blocks.extend(ee.lines)
            ee.lines = []
            if unguarded:
                blocks.extend(stores)
            else:
                blocks.append(f"    if ({r} < {m}u && {c} < {n}u) {{\n"
                              + "\n".join("    " + line[4:] for line in stores) + "\n    }")
    return _render_rb(mm, cfg, m, n, k, tm_tiles, tn_tiles, nb, loads,
                      epilogue="\n".join(blocks), rounds=0, rr=0, per_thread=0, lanes="")


def _thread_cols(ee: Emitter, tn: int) -> list[str]:
    """The ``tn`` columns of C a register-blocked product's thread holds, as WGSL lets: runs of
    4, 64 apart (see the template)."""
    return [ee.let(f"col0 + {(j // 4) * 64 + j % 4}u + tx * 4u", "c") for j in range(tn)]


def _special_epilogue(body: Program, mm: Eqn) -> bool:
    """Does the epilogue of matmul ``mm`` (the equations that depend on its result) hold an op
    outside PLAIN_EPILOGUE_OPS?"""
    after = {id(mm.out)}
    for e in body.eqns:
        if e is not mm and any(id(x) in after for x in e.inputs):
            after.update(id(o) for o in e.outs)
            if e.op not in PLAIN_EPILOGUE_OPS:
                return True
    return False


def _block_stores(body: Program, mm: Eqn, ee: Emitter, bc: tuple[str, ...], row: str,
                  cols: list[str], j: int, vec_out: bool, regs: str) -> list[str]:
    """The epilogue's stores at ``row`` and column ``j`` of a thread's block in a register-blocked
    product, whose row is in the vec4 registers ``regs`` 0, 1, ... (column j in lane j % 4 of
    ``{regs}{j // 4}``): with ``vec_out``, of the run of four columns from ``j``, one vec4 store
    per output (each lane's values computed right after its register is named); the statements
    before them go to ``ee.lines``."""
    def reg(jj: int) -> str:
        return f"{regs}{jj // 4}[{jj % 4}]"

    if not vec_out:
        return _epilogue_at(body, mm, ee, bc, row, cols[j], reg(j))
    heres: list[Idx] = []
    run: list[list[str]] = []
    for q in range(4):
        heres.append(_epilogue_here(mm, ee, bc, row, cols[j + q], reg(j + q)))
        run.append(_epilogue_values(body, mm, ee, heres[-1]))
    return [f"        out{o}[{heres[0].flat} / 4u] = vec4<{WGSL_STORAGE[v.dtype]}>("
            + ", ".join(lane[o] for lane in run) + ");" for o, v in enumerate(body.outputs)]


def _row_loop_epilogue(body: Program, names: dict[int, str], mm: Eqn,
                       cfg: tuple[int, int, int, int, int], m: int, n: int, batch: list[int],
                       vec: set[str], counter: list[int], wgsl_ty: str) -> str:
    """The epilogue of a register-blocked product one row of a thread's block at a time ("rows"):
    a loop over the rows whose trip count (the rows left in C) the compiler cannot know, so that
    it cannot unroll it; a switch copies the row's accumulators into the registers that one copy
    of the epilogue's code reads.

    Straight-line code for every element of the block ("direct") lets NVIDIA's compiler
    interleave all of their special functions at once, and an epilogue that keeps a value live
    across one (GELU's ``v / (1 + exp(...))``) then costs the whole kernel: H100, 4096^3, GPU ms,
    3 rounds, direct / rows: bare product 3.064-3.070; + bias 3.085-3.094 / 3.090-3.099, + bias
    + gelu 3.174-3.180 / 3.106-3.113, ``v / (1 + v^2)`` 3.168-3.173 / 3.073-3.083, ``v +
    exp(...)`` 3.231-3.238 / 3.127-3.133 (``bench/epilogue_probe.py --parts``). The bench MLP
    and transformer block were unchanged (1570-1573 / 1572-1574 and 1887-1889 / 1882-1883 us).
    The row's accumulators copied into a local array indexed by the row instead cost every
    epilogue about 190 us (3.269-3.278 ms): the array lives in memory."""
    _, _, _, tm, tn = cfg
    per = tn // 4
    lines = [f"    let rb = row0 + ty * {tm}u;",
             f"    let nrows = select(0u, min({tm}u, {m}u - rb), rb < {m}u);"]
    lines += [f"    var erow{jv}: vec4<{wgsl_ty}>;" for jv in range(per)]
    lines += ["    for (var i = 0u; i < nrows; i += 1u) {", "        switch i {"]
    for i in range(tm):
        sets = " ".join(f"erow{jv} = acc{i}_{jv};" for jv in range(per))
        lines.append(f"            {'default' if i == tm - 1 else f'case {i}u'}: {{ {sets} }}")
    lines.append("        }")
    ee = Emitter(body, names, indent="        ", counter=counter)
    r = ee.let("rb + i", "r")
    cols = _thread_cols(ee, tn)
    bc = _batch_coords(ee, batch)
    vec_out = "out0" in vec
    blocks: list[str] = []
    for j in range(0, tn, 4 if vec_out else 1):
        c = cols[j]
        stores = _block_stores(body, mm, ee, bc, r, cols, j, vec_out, "erow")
        blocks.extend(ee.lines)
        ee.lines = []
        blocks.append(f"        if ({c} < {n}u) {{\n"
                      + "\n".join("        " + st[4:] for st in stores) + "\n        }")
    return "\n".join(lines + blocks + ["    }"])


def _deferred_parts(body: Program, names: dict[int, str], mm: Eqn,
                    deferred: tuple[Var, list[Var]], a_groups: int, bk: int,
                    counter: list[int]) -> tuple[list[list[str]], list[str]]:
    """A deferred prologue's code (see _deferred_a), for the template: per A group and row of
    its four, the statements that load the thread's per-row values once (into registers
    ``ra{j}_{p}``, value j at the 4 rows of A group p; ``row`` is that row); and per A group,
    the statements that compute the group's A values from the values the prefetch loaded
    (``SRC``, the register they are in; ``ka`` their k) into ``fa``. A value past K's end (an
    edge tile's) is zero, as the plain loads leave it (rows past M's are never stored)."""
    a, b, batch, m, k, n, nb = _mm_dims(mm)
    full, rows = deferred
    row_loads: list[list[str]] = []
    for p in range(a_groups):
        per_row = []
        for q in range(4):
            em = Emitter(body, names, indent="            ", counter=counter)
            bc = _batch_coords(em, batch)
            vals = [em.value(r, Idx(r.shape, coords=bc + ("row", "0u"))) for r in rows]
            per_row.append("\n".join(em.lines + [f"            ra{j}_{p}[{q}] = {v};"
                                                  for j, v in enumerate(vals)]))
        row_loads.append(per_row)
    indent = "            "
    froms: list[str] = []
    for p in range(a_groups):
        out = [f"{indent}var fa = vec4<f32>();"]
        for q in range(4):
            em = Emitter(body, names, indent=indent + "    ", counter=counter)
            bc = _batch_coords(em, batch)
            here = bc + ("row", "ka")
            em.registers[id(full)] = (_nonunit(here, full.shape), f"SRC[{q}]")
            for j, r in enumerate(rows):
                em.registers[id(r)] = (_nonunit(bc + ("row", "0u"), r.shape), f"ra{j}_{p}[{q}]")
            val = em.value(a, Idx(a.shape, coords=here))
            out.append(f"{indent}{{\n{indent}    let row = row0 + ar + {q}u;\n"
                       + "".join(x + "\n" for x in em.lines)
                       + (f"{indent}    fa[{q}] = select(0.0f, {val}, ka < {k}u);" if k % bk
                          else f"{indent}    fa[{q}] = {val};")
                       + f"\n{indent}}}")
        froms.append("\n".join(out))
    return row_loads, froms


def _render_rb(mm: Eqn, cfg: tuple[int, int, int, int, int], m: int, n: int, k: int,
               tm_tiles: int, tn_tiles: int, nb: int, loads: dict[str, Any],
               **epilogue: Any) -> tuple[str, int]:
    bm, bn, bk, tm, tn = cfg
    dt = mm.out.dtype
    src = _env().get_template("matmul_rb.wgsl.j2").render(
        bm=bm, bn=bn, bk=bk, tm=tm, tn=tn, m=m, n=n, k=k, tm_tiles=tm_tiles, tn_tiles=tn_tiles,
        wy=bm // tm, threads=rb_threads(cfg),
        total=tm_tiles * tn_tiles * nb, ty=WGSL_TYPE[dt], zero=wgsl_literal(0, dt), **loads,
        **epilogue)
    return src, tm_tiles * tn_tiles * nb


def _a_pitch(cfg: tuple[int, int, int, int, int], workgroup_storage: int,
             sets: int = 1) -> int:
    """Vec4s between rows of the k-major A tile: one more than a row holds (padding: threads
    storing neighbouring k write to different banks) where the tiles then still fit the device's
    workgroup memory; else exactly a row, and the template swizzles it instead (vec4 c of row k at
    c ^ (k % 8)): no extra memory, but the index arithmetic cost 5-8% on the H100 where padding
    fits (4096^3 on the 128x128 tile: 4.16 ms swizzled, 3.96 padded; 4096x2048x4096 2.10, 1.99;
    2048x1024x2816 on 128x64 tiles 0.40, 0.37). Padded, the 128x128 and 64x64x32 tiles pass
    16 KiB, the least a WebGPU device offers; lavapipe offers 32 KiB, desktop GPUs as much or
    more."""
    bm, bn, bk, _, _ = cfg
    padded = bm // 4 + 1
    return padded if sets * 16 * bk * (padded + bn // 4) <= workgroup_storage else bm // 4


def _fit_storage(cfg: tuple[int, int, int, int, int],
                 workgroup_storage: int) -> tuple[int, int, int, int, int]:
    """The large tile steps K by 8 where the device cannot hold two sets of its 16-deep tiles
    (32 KiB swizzled), so that it stays pipelined (two sets of 8-deep tiles take 16 KiB, which
    every WebGPU device offers). The 128x192 tile, which needs two sets (40 KiB), becomes the large
    tile where they do not fit. A block forced by FUSEC_MATMUL_BLOCK is kept as it is."""
    if MATMUL_BLOCK is None and cfg == MATMUL_LARGE_WIDE and not _pipelined(cfg,
                                                                             workgroup_storage):
        cfg = MATMUL_LARGE
    if MATMUL_BLOCK is None and cfg == MATMUL_LARGE and not _pipelined(cfg, workgroup_storage):
        return _check_matmul_block((cfg[0], cfg[1], 8, cfg[3], cfg[4]))
    return cfg


def _pipelined(cfg: tuple[int, int, int, int, int], workgroup_storage: int) -> bool:
    """Does the product's kernel keep two sets of tiles, loading the next K step's values while it
    computes on the current ones (see the template)? On the 128x128 and 64x192 tiles, where the
    device holds two sets (swizzled if padding does not fit). On the H100, 4096^3 3.24 ms against
    3.96 single-buffered; on the 128x64 tile it measured slower (2048x2816x1024: 0.41 against
    0.37 ms). On the H200, 64x192 tiles, us, single-buffered / pipelined: 4096x384 @ 384x384
    52.8 / 49.3, 4096x1536 @ 1536x384 168.3 / 147.5; the thin 64x64 tile (MATMUL_THIN) too:
    4096x384 @ 384x384 50.5 / 44.8, 4096x1536 @ 1536x384 174.8 / 144.3."""
    bm, bn, bk, _, _ = cfg
    return ((large_tile(cfg) or (bm, bn) == MATMUL_WIDE[:2] or cfg == MATMUL_THIN
             or bool(PIPELINE_ALL)) and 2 * 16 * bk * (bm + bn) // 4 <= workgroup_storage)


def _staged_rows(body: Program, cfg: tuple[int, int, int, int, int]) -> int:
    """Rows of each thread's block per round of a staged epilogue ("staged"), or 0 to compute
    the epilogue straight from the registers (the rest; see epilogue_fuses). Staged measured no
    faster overall (H100, 128x64 tiles, ms, staged / direct, bias, relu, gelu: 2048x1024 @
    1024x2816 0.53 / 0.46, 0.53 / 0.46, 0.48 / 0.46; 4096x512 @ 512x4096 0.61 / 0.64, 0.61 /
    0.64, 0.70 / 0.64; 4096x4096 @ 4096x1024 1.49 / 1.50, 1.49 / 1.50, 1.82 / 1.74), and slower
    on the pipelined 128x128 tile (see epilogue_fuses). A round must fit the tiles' workgroup
    memory and give every thread the same number of vec4s."""
    if MATMUL_EPILOGUE != "staged" or len(body.eqns) == 1:
        return 0
    bm, bn, bk, tm, tn = cfg
    for rr in range(tm, 0, -1):
        chunk = (bm // tm) * rr * bn // 4  # vec4s of one round
        if tm % rr == 0 and chunk <= bk * (bm + bn) // 4 and chunk % rb_threads(cfg) == 0:
            return rr
    return 0


def _matmul_gemv(body: Program, names: dict[int, str], mm: Eqn) -> tuple[str, int]:
    """The few-row template (see GEMV_M): a thread per column, all rows of it."""
    a, b, batch, m, k, n, nb = _mm_dims(mm)
    # a K shorter than the tile (split-K's chunks of 128) takes a tile of its own length, rounded
    # up to the unrolled step: the rest would be zeros multiplied in (H200, 8x4096 @ 4096x4096 in
    # 32 chunks: 44.5-45.3 us with the 256 tile, 34.4-34.6 fitted; bench/workload_probe.py)
    kt = min(GEMV_K_TILE, -(-k // GEMV_UNROLL) * GEMV_UNROLL) if GEMV_FIT_K else GEMV_K_TILE
    col_blocks = -(-n // WORKGROUP)
    counter = [0]
    load_a, va = _operand(body, names, a, batch, ("row", "ka"), " " * 16, counter)
    load_b, vb = _operand(body, names, b, batch, ("kb", "col"), " " * 20, counter)
    ee = Emitter(body, names, indent="    ", counter=counter)
    bc = _batch_coords(ee, batch)
    blocks = []
    for i in range(m):
        stores = _epilogue_at(body, mm, ee, bc, f"{i}u", "col", f"acc{i}")
        blocks.extend(ee.lines)
        ee.lines = []
        blocks.append(f"    if (col < {n}u) {{\n"
                      + "\n".join("    " + line[4:] for line in stores) + "\n    }")
    dt = mm.out.dtype
    src = _env().get_template("matmul_gemv.wgsl.j2").render(
        wg=WORKGROUP, kt=kt, unroll=GEMV_UNROLL, m=m, n=n, k=k, col_blocks=col_blocks,
        total=col_blocks * nb, ty=WGSL_TYPE[dt], zero=wgsl_literal(0, dt), load_a=load_a,
        val_a=va, load_b=load_b, val_b=vb, epilogue="\n".join(blocks))
    return src, col_blocks * nb


def _row_col_parts(body: Program, names: dict[int, str], mm: Eqn, load_indent: int,
                   epilogue_indent: int, product: str
                   ) -> tuple[str, str, str, str, list[str], list[str]]:
    """For templates whose threads name their operands' elements A[bt, row, ka] and B[bt, kb, col]
    and finish C[bt, row, col] held in ``product``: the loads and values of A and B, and the
    epilogue's statements and stores (everything after the product, evaluated there)."""
    a, b, batch, *_ = _mm_dims(mm)
    counter = [0]
    load_a, va = _operand(body, names, a, batch, ("row", "ka"), " " * load_indent, counter)
    load_b, vb = _operand(body, names, b, batch, ("kb", "col"), " " * load_indent, counter)
    ee = Emitter(body, names, indent=" " * epilogue_indent, counter=counter)
    stores = _epilogue_at(body, mm, ee, _batch_coords(ee, batch), "row", "col", product)
    return load_a, va, load_b, vb, ee.lines, stores


def _matmul_fewcol(body: Program, names: dict[int, str], mm: Eqn) -> tuple[str, int]:
    """The few-column template: ``fewcol_lanes`` threads per row, the K tile FEWCOL_K_TILE, which
    also keeps B's tile within the workgroup array that the combine needs anyway. Tried and
    dropped (H200, 4096x4096 @ 4096x8 in chunks of 256, 3 interleaved rounds): B's tile and the
    sums as vec4s, a value of A meeting four columns in one workgroup load, 58.4-58.5 us against
    47.5-47.6; each thread's loads of A all issued before its arithmetic, 46.8 against 46.8."""
    _, _, _, m, k, n, nb = _mm_dims(mm)
    lanes = fewcol_lanes(n, k)
    assert lanes & (lanes - 1) == 0, "the combine halves the lanes"
    kt = FEWCOL_K_TILE
    rows = WORKGROUP // lanes
    row_blocks = -(-m // rows)
    load_a, va, load_b, vb, epilogue, stores = _row_col_parts(body, names, mm, 16, 12, "prod")
    dt = mm.out.dtype
    strides = [1 << i for i in range(lanes.bit_length() - 2, -1, -1)]  # lanes/2 .. 1
    src = _env().get_template("matmul_fewcol.wgsl.j2").render(
        wg=WORKGROUP, lanes=lanes, rows=rows, kt=kt, m=m, n=n, k=k,
        row_blocks=row_blocks, total=row_blocks * nb, ty=WGSL_TYPE[dt], zero=wgsl_literal(0, dt),
        load_a=load_a, val_a=va, load_b=load_b, val_b=vb, strides=strides,
        epilogue="\n".join(epilogue + ["    " + st for st in stores]))
    return src, row_blocks * nb


def _matmul_fewcol4(body: Program, names: dict[int, str], mm: Eqn, src: Var,
                    workgroup_storage: int) -> tuple[str, int]:
    """The few-column template over vec4 rows of A (see FEWCOL4): A read from input ``src``, bound
    as vec4s. B's tile and the combine share one workgroup array of vec4s: the tile is the
    longest of at most FEWCOL4_K_TILE rows (a whole number of steps of the lanes) that fits."""
    a, b, batch, m, k, n, nb = _mm_dims(mm)
    lanes, rows = FEWCOL4_LANES, FEWCOL4_ROWS
    groups = WORKGROUP // lanes
    wrows = groups * rows
    row_blocks = -(-m // wrows)
    n4 = -(-n // 4) * 4
    step = 4 * lanes
    kt = min(FEWCOL4_K_TILE, -(-k // step) * step)
    while kt > step and n4 * max(kt, WORKGROUP) * 4 > workgroup_storage:
        kt //= 2
    kt = max(step, kt // step * step)
    # 12 columns at the least tile take 12 KiB: every WebGPU device offers 16
    assert n4 * max(kt, WORKGROUP) * 4 <= workgroup_storage, "FEWCOL4_MAX_N fits any device"
    counter = [0]
    ea = Emitter(body, names, indent="    ", counter=counter)
    bc = _batch_coords(ea, batch)
    producers = {id(o): e for e in body.eqns for o in e.outs}
    st = view_strides(*_operand_path(producers, a))
    assert st is not None, "_a_source reads only strided views as vec4s"
    a_load = []
    for r in range(rows):
        rc = ea.let(f"min(row0 + {r}u, {m - 1}u)", "r")
        flat = _strided_index(ea, Idx(a.shape, coords=bc + (rc, "0u")), st)
        base = ea.let(f"{flat} / 4u", "ab")
        a_load.append(f"{names[id(src)]}[{base} + kv0 + v]")
    _, _, load_b, vb, epilogue, stores = _row_col_parts(body, names, mm, 20, 16, "prod")
    dt = mm.out.dtype
    strides = [1 << i for i in range(lanes.bit_length() - 2, -1, -1)]  # lanes/2 .. 1
    src_text = _env().get_template("matmul_fewcol4.wgsl.j2").render(
        wg=WORKGROUP, lanes=lanes, rows=rows, groups=groups, wrows=wrows, kt=kt, kv=kt // 4,
        steps=kt // step, n4=n4, sb_len=n4 * max(kt, WORKGROUP) // 4, m=m, n=n, k=k,
        row_blocks=row_blocks, total=row_blocks * nb, ty=WGSL_TYPE[dt], zero=wgsl_literal(0, dt),
        a_bases="\n".join(ea.lines), a_load=a_load, load_b=load_b, val_b=vb, strides=strides,
        epilogue="\n".join(epilogue + ["    " + s for s in stores]))
    return src_text, row_blocks * nb


def use_rowk(m: int, n: int, k: int, nb: int, target: str) -> bool:
    """8 or 12 columns, many rows and a long K, one product (no batch), on a GPU: the
    few-column template over whole rows (see ROWK), where both operands' rows are runs of vec4s
    (rowk_operands before fusion, _rowk_views in the kernel)."""
    return (target == "gpu" and ROWK and nb == 1 and n % 4 == 0
            and FEWCOL4_MIN_N <= n <= FEWCOL4_MAX_N
            and m >= (ROWK_MIN_M if n <= 8 else ROWK_MIN_M_WIDE)
            and k >= FEWCOL4_MIN_K and k % 4 == 0)


def rowk_plan(m: int, k: int) -> tuple[int, int, int]:
    """(lanes, rows, threads) of matmul_rowk for an M x K A: the lanes that give each thread
    about ROWK_STEPS vec4s of a row, ROWK_ROWS rows a thread where M allows (see ROWK)."""
    lanes = ROWK_MIN_LANES
    while lanes < ROWK_MAX_LANES and k // 4 // (2 * lanes) >= ROWK_STEPS:
        lanes *= 2
    rows = ROWK_ROWS if m >= ROWK_MANY_ROWS_M else ROWK_FEW_ROWS
    return lanes, rows, max(ROWK_THREADS, lanes)


RowkView = tuple[Var, list[Eqn], tuple[int, ...]]  # an operand's source, movement path, strides


def _rowk_operand_views(producers: dict[int, Eqn], mm: Eqn
                        ) -> Optional[tuple[RowkView, RowkView]]:
    """A's and B's sources, the movement equations from them and the views' strides, where both
    are float32 views whose rows (A's along K, B's) are runs that start on a vec4, as
    matmul_rowk reads them; else None."""
    a, b, *_ = _mm_dims(mm)
    if not a.dtype == b.dtype == mm.out.dtype == "float32":
        return None
    views = []
    for x in (a, b):
        src, path = _operand_path(producers, x)
        st = view_strides(src, path)
        if st is None or not _vec4_runs(st, x.shape):
            return None
        views.append((src, path, st))
    return views[0], views[1]


def rowk_operands(prog: Program, mm: Eqn) -> bool:
    """Before fusion (split_k): would product ``mm``'s kernel read both operands as
    matmul_rowk does (_rowk_operand_views), from two buffers, neither computed in the kernel by
    a cast nor padded? Then it is not cut into chunks."""
    producers = {id(o): e for e in prog.eqns for o in e.outs}
    views = _rowk_operand_views(producers, mm)
    if views is None:
        return False
    (src_a, path_a, _), (src_b, path_b, _) = views
    casts = [producers[id(x)] for x in (src_a, src_b) if id(x) in producers
             and producers[id(x)].op is Op.CAST]  # (float16 widened where it is loaded)
    return (src_a is not src_b and not casts
            and not any(e.op is Op.PAD for e in path_a + path_b))


def _rowk_views(body: Program, mm: Eqn) -> Optional[tuple[RowkView, RowkView]]:
    """The views product ``mm`` on matmul_rowk reads A and B through (_rowk_operand_views), of
    kernel inputs (what rowk_operands saw before fusion), or None. Each input is bound as vec4s
    where nothing else in the kernel reads it (_a_source, _b_source), else as scalars read four
    at a time."""
    views = _rowk_operand_views({id(o): e for e in body.eqns for o in e.outs}, mm)
    if views is None or not all(any(v is src for v in body.inputs) for src, _, _ in views):
        return None
    src_b, path_b, _ = views[1]
    return None if _padded_chunks(src_b, path_b, _mm_dims(mm)[1]) else views


def _rowk_vectors(body: Program, mm: Eqn) -> set[Var]:
    """Of the inputs matmul_rowk reads (_rowk_views), those bound as vec4s."""
    return {x for x in (_a_source(body, mm), _b_source(body, mm)) if x is not None}


def _matmul_rowk(body: Program, names: dict[int, str], mm: Eqn,
                 views: tuple[RowkView, RowkView], vec: set[str]) -> tuple[str, int]:
    """The few-column template over whole rows (see ROWK): A and B read through ``views``
    (_rowk_views), as vec4s where their inputs' bindings are in ``vec``, else four scalars at a
    time; one workgroup per ``threads / lanes * rows`` rows."""
    a, b, batch, m, k, n, nb = _mm_dims(mm)
    assert nb == 1 and n % 4 == 0, "use_rowk: one product, whole vec4s of B's rows"
    lanes, rows, wg = rowk_plan(m, k)
    wrows = wg // lanes * rows
    row_blocks = -(-m // wrows)
    n4 = n // 4
    em = Emitter(body, names, indent="    ", counter=[0])
    (src_a, _, st_a), (src_b, _, st_b) = views

    def vec4_at(x: Var, at: str) -> str:
        """vec4 number ``at`` of input ``x``: one load where it is bound as vec4s."""
        name = names[id(x)]
        if name in vec:
            return f"{name}[{at}]"
        return f"vec4<f32>({', '.join(f'{name}[4u * ({at}) + {q}u]' for q in range(4))})"

    a_load = []
    for r in range(rows):
        rc = em.let(f"min(row0 + {r}u, {m - 1}u)", "r")
        flat = _strided_index(em, Idx(a.shape, coords=(rc, "0u")), st_a)
        base = em.let(f"{flat} / 4u", "ab")
        a_load.append(vec4_at(src_a, f"{base} + v"))
    bbase = em.let(f"{_strided_index(em, Idx(b.shape, coords=('0u', '0u')), st_b)} / 4u", "bb")
    brow = st_b[-2] // 4  # vec4s from one row of B to the next
    b_load = [[vec4_at(src_b, f"{bbase} + (4u * v + {q}u) * {brow}u + {h}u") for h in range(n4)]
              for q in range(4)]
    *_, epilogue, stores = _row_col_parts(body, names, mm, 20, 16, "prod")
    dt = mm.out.dtype
    strides = [1 << i for i in range(lanes.bit_length() - 2, -1, -1)]  # lanes/2 .. 1
    src_text = _env().get_template("matmul_rowk.wgsl.j2").render(
        wg=wg, lanes=lanes, rows=rows, wrows=wrows, kv=k // 4, n4=n4, m=m, n=n, k=k,
        total=row_blocks, ty=WGSL_TYPE[dt], zero=wgsl_literal(0, dt), bases="\n".join(em.lines),
        a_load=a_load, b_load=b_load, strides=strides,
        epilogue="\n".join(epilogue + ["    " + st for st in stores]))
    return src_text, row_blocks


def use_fewcol4(m: int, n: int, k: int, nb: int, target: str) -> bool:
    """Few columns, many rows and a long K (counting the batch), on a GPU: the few-column
    template over vec4 rows of A, where A can be read so (_a_source; else the 16x16 kernel). ``k``
    counts B's rows in one product of the batch; split_k's chunks count as the batch, so that a
    product cut along K keeps the template chosen for it whole."""
    return (target == "gpu" and FEWCOL4 and FEWCOL4_MIN_N <= n <= FEWCOL4_MAX_N
            and m >= FEWCOL_M and k * nb >= FEWCOL4_MIN_K and k % 4 == 0)


def use_fewcol(m: int, n: int, k: int, nb: int, target: str) -> bool:
    """Few columns, many rows (counting the batch), on a GPU: the few-column template. Measured on
    the H100 (trusted modules, us; 2^24-element A, M x K x N; lanes 8 / 16 / 32, then the 16x16
    kernel split along K, then torch): 65536x256x4 37 / 35 / 42, 76, 58; x8 45 / 53 / 80, 76, 57;
    x12 62 / 80 / 127, 77; x16 81 / 111 / 183, 76; 16384x1024x1 33 / 29 / 30, 88, 41; x8 61 / 80 /
    73, 88, 78; x12 69 / 92 / 114, 88; x16 124 / 140 / 169, 88; 8192x2048x4 44 / 37 / 34, 80;
    x8 103 / 79 / 88, 81; 4096x4096x1 62 / 39 / 34, 79, 45; x4 67 / 45 / 38, 80; x8 195 / 140 /
    87, 81, 63; x16 213 / 169 / 205, 81. So: up to 4 columns always, up to 12 with K <= 1024."""
    return (target == "gpu" and FEWCOL and m * nb >= FEWCOL_M
            and (n <= 4 or (n <= 12 and k <= 1024)))


def fewcol_lanes(n: int, k: int) -> int:
    """Threads per row of the few-column template (the table in use_fewcol): more columns means
    more sums per thread and B's tile staged for fewer rows, so fewer lanes per row and more rows
    per workgroup; up to 4 columns, a long K wants more lanes to split it."""
    if n > 4:
        return 8
    return 32 if k >= 2048 else 16


def use_gemv(m: int, n: int, target: str, k: int) -> bool:
    """Few rows, many columns and a large B, on a GPU: the few-row template (see GEMV_M). ``k``
    counts B's rows in all: K times the batch, so that a product cut along K (a batch of its
    chunks, fusec.passes.splitk) keeps the template chosen for it whole."""
    return (target == "gpu" and GEMV and m <= GEMV_M and n >= WORKGROUP
            and k * n >= GEMV_MIN_KN)


def _matmul(body: Program, names: dict[int, str], target: str = "gpu",
            workgroup_storage: int = WORKGROUP_STORAGE, vec: Optional[set[str]] = None
            ) -> tuple[str, int]:
    mm = next(e for e in body.eqns if e.op is Op.MATMUL)
    _, _, _, m, k, n, nb = _mm_dims(mm)
    cfg = matmul_config(m, n, target, k, nb)
    if cfg is not None:
        return _matmul_rb(body, names, mm, cfg, workgroup_storage, vec or set(), target)
    if use_gemv(m, n, target, k * nb):
        return _matmul_gemv(body, names, mm)
    views = _rowk_views(body, mm) if use_rowk(m, n, k, nb, target) else None
    if views is not None:
        return _matmul_rowk(body, names, mm, views, vec or set())
    src_a = _a_source(body, mm) if use_fewcol4(m, n, k, nb, target) else None
    if src_a is not None and names.get(id(src_a)) in (vec or set()):
        return _matmul_fewcol4(body, names, mm, src_a, workgroup_storage)
    if use_fewcol(m, n, k, nb, target):
        return _matmul_fewcol(body, names, mm)
    tn, tm = -(-n // TILE), -(-m // TILE)
    load_a, va, load_b, vb, epilogue, stores = _row_col_parts(body, names, mm, 12, 8, "acc")
    dt = mm.out.dtype
    src = _env().get_template("matmul.wgsl.j2").render(
        tile=TILE, m=m, n=n, k=k, tn=tn, tm=tm, total=tn * tm * nb, ty=WGSL_TYPE[dt],
        zero=wgsl_literal(0, dt), load_a=load_a, val_a=va, load_b=load_b, val_b=vb,
        epilogue="\n".join(epilogue), stores="\n".join(stores), unrolled=target == "cpu",
        copies=loop_copies(target, 1, -(-k // TILE)))
    return src, tn * tm * nb


def check(kind: str, body: Program) -> bool:
    """Can a kernel of ``kind`` compute ``body``? (The fusion pass asks before merging.)"""
    try:
        if kind == "quant":
            kernel = Eqn(Op.KERNEL, tuple(body.inputs), tuple(body.outputs),  # type: ignore[arg-type]
                         {"kind": kind, "name": "check", "body": body})
            _quant.generate(kernel)
            return True
        _, names = _bindings(body)
        {"elementwise": _elementwise, "reduce": _reduce, "matmul": _matmul}[kind](
            body, names)  # type: ignore[operator]
    except Unaligned:
        return False
    return True
