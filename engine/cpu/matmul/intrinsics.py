"""The byte dot-product intrinsics of the CPU matmul kernels: LLVM IR builders for a tile's integer sums,
one per format family, on the instructions engine/cpu/simd.py emits for the level."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.cpu import simd
from engine.quant import IQ4_LEVELS, QK, ROWS

# The byte dot-product kernels (the `_vnni` tiles; named for AVX-512 VNNI, which LLVM never produced
# from the int16 loops, nor from any loop shape tried): one vpdpwssd multiplies 16 int32 lanes, each
# holding two int16 weights, by two broadcast int16 activations and adds both products to 16 int32 sums
# (32 multiply-adds an instruction, where vpmullw + vpaddw do 32 in two). Written as LLVM IR in
# intrinsics, on whole 512-bit values, whose products engine/cpu/simd.py emits for the level in use:
# VNNI's, AVX-VNNI's or AVX2's instructions, the same integers. Only the portable level (no x86
# intrinsic) takes the int16 kernels; LLAMBA_CPU_LEVEL picks a lower level (engine/cpu/isa.py).
BYTE_DOT = simd.TARGET.level.byte_dot
_V16I32 = simd.V16I32
_V16I8 = ir.VectorType(ir.IntType(8), 16)


def _vector_at(context, builder, array_type, array, at, vector):  # type: ignore[no-untyped-def]
    """Pointer to array[at] as a pointer to `vector` (no bounds check: callers index inside)."""
    ary = context.make_array(array_type)(context, builder, array)
    item = cgutils.get_item_pointer(context, builder, array_type, ary, [at], wraparound=False)
    return builder.bitcast(item, vector.as_pointer())


def _widen_bytes16(context, builder, array_type, array, at, signed: bool):  # type: ignore[no-untyped-def]
    """The 16 bytes array[at:] widened to int32 lanes."""
    raw = builder.load(_vector_at(context, builder, array_type, array, at, _V16I8), align=1)
    return (builder.sext if signed else builder.zext)(raw, _V16I32)


def _splat(value: int):  # type: ignore[no-untyped-def]
    return ir.Constant(_V16I32, [value] * 16)


def _broadcast(builder, x32):  # type: ignore[no-untyped-def]
    """An int32 in all 16 lanes."""
    x = builder.insert_element(ir.Constant(_V16I32, ir.Undefined), x32, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(x, ir.Constant(_V16I32, ir.Undefined), _splat(0))


# The Q4_0 and Q4_1 decode tiles (1-2 tokens) prefetch their weight bytes this far ahead: the
# hardware prefetchers stop at 4 KiB boundaries. Measured in one process, the two variants alternated
# over Qwen-shaped matrices streaming through 206-293 MiB (scripts/bench_huge_pages.py, 2 threads,
# 2026-12-03): Q4_1 with it 28.76 / 26.74 GB/s, without 27.24 / 25.71. The K-quant tiles (Q4_K, Q6_K)
# do more arithmetic a byte and stream faster without it, which the hardware prefetchers keep up with:
# Q4_K 19.04 -> 21.68 and 18.01 -> 21.85 GB/s, Q6_K 27.60 -> 29.76 and 24.53 -> 25.84 (Qwen2.5-Coder
# 1.5B tg64, 4 pairs alternated: 25.4 -> 27.6 t/s). An earlier VM measured Q4_K the other way (13.6 ->
# 27.8 GB/s with it), so re-measure on a new machine. Tiles of 4+ tokens are compute-bound and do not
# prefetch.
PREFETCH_BYTES = 1024


@intrinsic
def _prefetch(typingctx, array, at):  # type: ignore[no-untyped-def]
    """Hint the cache line holding array[at] into L1 (llvm.prefetch; never faults, even past the end)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        index = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = _vector_at(context, builder, sig.args[0], args[0], index, ir.IntType(8))
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(array, at), codegen


def _int16_pairs(builder, low, high):  # type: ignore[no-untyped-def]
    """int32 lanes holding (low, high) as two int16."""
    return builder.or_(builder.and_(low, _splat(0xFFFF)), builder.shl(high, _splat(16)))


def _register_sums(n_tok: int, n_steps: int, weight_pairs, chains: int = 1):  # type: ignore[no-untyped-def]
    """An intrinsic computing, for a tile of n_tok tokens and 32 rows, sums[t * 32 + r] = the sum over
    n_steps steps of vpdpwssd(weight pairs of the step, activation pair xp[row0 + t, col0 + step]),
    its accumulators held in registers and written once (LLVM keeps a stack tile in memory). With few
    tokens the steps alternate between `chains` accumulators, added at the end (integers: the same
    sums), so that vpdpwssd's latency is not one long dependency chain."""

    @intrinsic
    def register_sums(typingctx, sums, packed, packed_at, xp, row0, col0):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, packed_type, _, xp_type, _, _ = sig.args
            i64 = ir.IntType(64)
            at0, row, col = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 5))
            xp_array = context.make_array(xp_type)(context, builder, args[3])
            acc = [[[_splat(0) for _ in range(chains)] for _ in (0, 1)] for _ in range(n_tok)]
            for step in range(n_steps):
                weights = [
                    weight_pairs(context, builder, packed_type, args[1], at0, step, lane) for lane in (0, 1)
                ]
                for t in range(n_tok):
                    index = [builder.add(row, ir.Constant(i64, t)), builder.add(col, ir.Constant(i64, step))]
                    x_ptr = cgutils.get_item_pointer(
                        context, builder, xp_type, xp_array, index, wraparound=False
                    )
                    x = _broadcast(builder, builder.load(x_ptr))
                    for lane in (0, 1):
                        chain = acc[t][lane]
                        chain[step % chains] = simd.dot_pairs(builder, chain[step % chains], weights[lane], x)
            for t in range(n_tok):
                for lane in (0, 1):
                    total = acc[t][lane][0]
                    for partial in acc[t][lane][1:]:
                        total = builder.add(total, partial)
                    at = ir.Constant(i64, t * ROWS + lane * 16)
                    builder.store(
                        total, _vector_at(context, builder, sums_type, args[0], at, _V16I32), align=4
                    )
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, xp, row0, col0), codegen

    return register_sums


@intrinsic
def _k_min_sums(typingctx, out, mins, mins_at, xsum, row, col):  # type: ignore[no-untyped-def]
    """out[r] = sum over the 8 blocks bb of mins[mins_at + bb * 32 + r] x xsum[row, col + bb], r < 32: a
    K-quant super-block's mins (unsigned bytes, 32 rows a block) against its blocks' activation sums,
    in int32 vectors (the same integers in any order). As a lane loop in _k_superblock_lanes LLVM
    unrolled the rows into 32 scalar multiply-add chains; see q4k.py for what that cost."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        out_type, mins_type, _, xsum_type, _, _ = sig.args
        i64 = ir.IntType(64)
        at0, row, col = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 5))
        xsum_array = context.make_array(xsum_type)(context, builder, args[3])
        xs = []
        for bb in range(8):
            index = [row, builder.add(col, ir.Constant(i64, bb))]
            ptr = cgutils.get_item_pointer(context, builder, xsum_type, xsum_array, index, wraparound=False)
            xs.append(_broadcast(builder, builder.load(ptr)))
        for lane in (0, 1):
            total = _splat(0)
            for bb in range(8):
                at = builder.add(at0, ir.Constant(i64, bb * ROWS + lane * 16))
                m = _widen_bytes16(context, builder, mins_type, args[1], at, signed=False)
                total = builder.add(total, builder.mul(m, xs[bb]))
            ptr = _vector_at(context, builder, out_type, args[0], ir.Constant(i64, lane * 16), _V16I32)
            builder.store(total, ptr, align=4)
        return context.get_dummy_value()

    return types.void(out, mins, mins_at, xsum, row, col), codegen


def _int8_pairs(context, builder, packed_type, packed, at0, step: int, lane: int):  # type: ignore[no-untyped-def]
    """Q8_0 layout, positions 2 * step and 2 * step + 1: the int8 quants of 16 rows, paired."""
    first, second = (
        _widen_bytes16(
            context,
            builder,
            packed_type,
            packed,
            builder.add(at0, ir.Constant(ir.IntType(64), at)),
            signed=True,
        )
        for at in ((2 * step) * ROWS + lane * 16, (2 * step + 1) * ROWS + lane * 16)
    )
    return _int16_pairs(builder, first, second)


# Tiles of the 4-bit layout, every size: vpdpbusd multiplies 4 unsigned weight bytes of
# one row by 4 signed activation bytes and adds the 4 products to the row's int32 lane: 64 multiply-adds
# an instruction where vpdpwssd does 32 and the int16 path 32 in two. Its 4 bytes must be 4 positions of
# one row, and the packed layout keeps the 32 rows of a position together, so 4 positions (128 bytes,
# two loads) are transposed in registers by one byte shuffle per 16 rows (vpermt2b on AVX512-VBMI).
# Integer sums: the same half-block sums as the int16 path, bit for bit.
_V64I8 = ir.VectorType(ir.IntType(8), 64)
# Shuffle of (positions p, p + 1 | positions p + 2, p + 3), 32 row bytes each: byte 4r + k of lane L's
# vector is position p + k of row 16L + r.
_QUAD_MASKS = [
    ir.Constant(
        ir.VectorType(ir.IntType(32), 64), [32 * k + lane * 16 + r for r in range(16) for k in range(4)]
    )
    for lane in (0, 1)
]


def _transposed_quads(context, builder, packed_type, packed, at0, positions, masks=_QUAD_MASKS):  # type: ignore[no-untyped-def]
    """Per 16-row lane, 4 bytes a row: those of `positions` (each the start of 64 bytes: 2 x 32 rows).
    masks None: the bytes are stored so already (Q4_K's records), each 64 bytes one lane."""
    first, second = (
        builder.load(
            _vector_at(
                context,
                builder,
                packed_type,
                packed,
                builder.add(at0, ir.Constant(ir.IntType(64), at)),
                _V64I8,
            ),
            align=1,
        )
        for at in positions
    )
    if masks is None:
        return [first, second]
    return [builder.shuffle_vector(first, second, masks[lane]) for lane in (0, 1)]


def _bytes(value: int | list[int]):  # type: ignore[no-untyped-def]
    return ir.Constant(_V64I8, value if isinstance(value, list) else [value] * 64)


def _nibble_quads(context, builder, packed_type, packed, at0, q: int, masks=_QUAD_MASKS):  # type: ignore[no-untyped-def]
    """Positions 4q .. 4q + 3 after at0, per 16-row lane: (low nibbles, high nibbles), 4 bytes a row."""
    out = []
    for rows in _transposed_quads(
        context, builder, packed_type, packed, at0, ((4 * q) * ROWS, (4 * q + 2) * ROWS), masks
    ):
        low = builder.and_(rows, _bytes(15))
        high = builder.lshr(rows, _bytes(4))
        out.append(tuple(builder.bitcast(v, _V16I32) for v in (low, high)))
    return out


def _q6k_row_quads(context, builder, packed_type, packed, at0, high_type, high, high_at0, q: int):  # type: ignore[no-untyped-def]
    """Q6_K positions 4q .. 4q + 3, per 16-row lane: (unsigned 6-bit weights j, unsigned 6-bit weights
    j + 16), 4 bytes a row, from Q6_K in row quads (engine/cpu/records.py): the nibble bytes stored as
    _transposed_quads leaves them, and one 64-byte qh vector whose bit pairs 0-1, 2-3, 4-5, 6-7 are the
    top bits of (lane 0, weights j), (lane 0, j + 16), (lane 1, j), (lane 1, j + 16): each moved to bits
    4-5 with one shift and one mask, no shuffle."""
    quads = _transposed_quads(
        context, builder, packed_type, packed, at0, ((4 * q) * ROWS, (4 * q + 2) * ROWS), masks=None
    )
    tops_at = builder.add(high_at0, ir.Constant(ir.IntType(64), q * 2 * ROWS))
    h = builder.load(_vector_at(context, builder, high_type, high, tops_at, _V64I8), align=1)
    out = []
    for lane, rows in enumerate(quads):
        pair = []
        for part, nibbles in enumerate((builder.and_(rows, _bytes(15)), builder.lshr(rows, _bytes(4)))):
            pair_at = 2 * (2 * lane + part)  # the bit pair's place in the byte
            tops = builder.shl(h, _bytes(4 - pair_at)) if pair_at <= 4 else builder.lshr(h, _bytes(2))
            weights = builder.or_(nibbles, builder.and_(tops, _bytes(0x30)))
            pair.append(builder.bitcast(weights, _V16I32))
        out.append(tuple(pair))
    return out


def _broadcast_at(context, builder, xb_type, xb_array, row, col):  # type: ignore[no-untyped-def]
    """xb[row, col] (an int32) in all 16 lanes."""
    ptr = cgutils.get_item_pointer(context, builder, xb_type, xb_array, [row, col], wraparound=False)
    return _broadcast(builder, builder.load(ptr))


def _store_chains(context, builder, sums_type, sums, acc) -> None:  # type: ignore[no-untyped-def]
    """sums[t * 32 + 16 * lane:][:16] = the sum of acc[t][lane]'s chains."""
    for t, per_lane in enumerate(acc):
        for lane, chains in enumerate(per_lane):
            total = chains[0]
            for partial in chains[1:]:
                total = builder.add(total, partial)
            at = ir.Constant(ir.IntType(64), t * ROWS + lane * 16)
            builder.store(total, _vector_at(context, builder, sums_type, sums, at, _V16I32), align=4)


def _quad_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """An intrinsic computing half a 4-bit block's sums for a tile of n_tok tokens and 32 rows:
    sums[t * 32 + r] = sum over positions j < 8 of w[r, j] * x[t, j] + w[r, j + 16] * x[t, j + 16], where
    xb[row0 + t, col0 + q] holds the 4 int8 activations x[4q .. 4q + 3] and xb[., col0 + 4 + q] those
    16 positions on. Integer sums, so the `chains` accumulators that break vpdpbusd's latency chain
    change nothing."""

    @intrinsic
    def quad_sums(typingctx, sums, packed, packed_at, xb, row0, col0):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, packed_type, _, xb_type, _, _ = sig.args
            at0, row, col = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 5))
            quads = _Quads(2, lambda q: _nibble_quads(context, builder, packed_type, args[1], at0, q))
            acc = _dpbusd_quads(
                context, builder, n_tok, chains, quads, xb_type, args[3], row, col, max_weight=15
            )
            _store_chains(context, builder, sums_type, args[0], acc)
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, xb, row0, col0), codegen

    return quad_sums


class _Quads:
    """A block's weight quads, emitted where a tile first reads each (quads[q][lane][part]), again after
    `forget`: decoded all up front, a 4-token AVX2 tile kept 16 weight vectors live beside its 8 int16
    sums and spilled (LLVM follows the IR's order here)."""

    def __init__(self, count: int, make) -> None:  # type: ignore[no-untyped-def]
        self.count, self.make, self.made = count, make, {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, q: int):  # type: ignore[no-untyped-def]
        if q not in self.made:
            self.made[q] = self.make(q)
        return self.made[q]

    def forget(self) -> None:
        self.made = {}


def _plus(builder, value, n: int):  # type: ignore[no-untyped-def]
    return builder.add(value, ir.Constant(ir.IntType(64), n))


def _dpbusd_quads(
    context,
    builder,
    n_tok: int,
    chains: int,
    quads,
    xb_type,
    xb,
    row,
    col,
    signed=False,
    max_weight=127,
    parts=(0, 1),
    by=None,
    done=None,
    whole_lanes=False,
):  # type: ignore[no-untyped-def]
    """acc[t][lane] (`chains` partial sums): vpdpbusd of quads[q][lane] = (unsigned bytes of positions
    4q.., of 16 + 4q..; signed bytes with `signed`, simd.dot_signed) with the activations
    xb[row + t, col + q] and xb[row + t, col + q + 4] (only `parts` of the two). Weights up to
    max_weight let AVX2 add several products in int16 before widening them (simd.word_budget), times
    by(lane)'s int16 factors where `by` is given (simd.widen_words). done(lanes, acc) is called as soon as
    those lanes' sums are complete: a 4-token AVX2 tile's lane 0 stored before lane 1 starts keeps its
    8 sums out of lane 1's registers."""
    xb_array = context.make_array(xb_type)(context, builder, xb)
    dot = simd.dot_signed if signed else simd.dot_unsigned
    # The products go in chunks, each widened once:
    # - VNNI (and AVX2's signed weights) accumulate every product in place: a chunk is a quad's parts,
    #   taken per token, the order the VNNI tiles were measured in (with the parts outermost, Q4_1's 8-
    #   and 64-token tiles took 1.10-1.13x the time, scripts/ab_matmul.py).
    # - AVX2 adds the int16 pair sums of a chunk before one widening: in tiles of 1 and 2 tokens as many
    #   as fit (simd.word_budget: Q4_K's whole block), each token's sums live across the chunk; in tiles
    #   of 4, pairs of products, one token and one 16-row lane at a time, since the int32 sums of 4 tokens
    #   x 32 rows alone fill the 16 ymm registers. Int16 sums for 4 tokens beside them spilled: Qwen2.5-
    #   Coder's pp512 ran 0.82x llama.cpp's against 1.03x without them (decode: 0.95x -> 1.14x with them;
    #   2026-12-05, bench_pairs --interleave, 4 rounds each).
    # - `whole_lanes` (Q4_K's records, Q6_K's row quads): in tiles of 4, one 16-row lane at a time, every
    #   token's int16 sums of a chunk as big as the budget allows (Q4_K: the whole block, 8 registers),
    #   widened once (by the scales: `by`) and handed to `done` before the next lane starts, the weights
    #   decoded where first used, the activations loaded again for lane 1 (_reload_barrier). Q4_K's
    #   4-token block went from 126 to 103 cycles (llvm-mca, znver3; 131 stack accesses to 3); Q4_K
    #   8960 x 1536, one thread: 0.61x the time at T = 64 (scripts/ab_matmul.py --rev 1b03426,
    #   NUMBA_NUM_THREADS=1, 2026-12-07). The other formats, measured so, were no faster (Q4_0, Q4_1: the
    #   same; Q5_K, Q5_1: 1.3-1.5x slower): their weights are shuffled per lane and their budget or their
    #   float epilogue per half block decides.
    budget = 1 if signed else simd.word_budget(max_weight)
    group = budget if n_tok <= 2 or whole_lanes else min(2, budget)
    acc = [[[_splat(0) for _ in range(chains)] for _ in (0, 1)] for _ in range(n_tok)]
    steps = [(q, part) for q in range(len(quads)) for part in parts]
    size = group if group > 1 else len(parts)
    steps_outer = group > 1 and (n_tok <= 2 or whole_lanes)
    for lanes in ((0,), (1,)) if n_tok > 2 and simd.WORD_SUMS else ((0, 1),):
        if lanes == (1,) and whole_lanes:
            _reload_barrier(builder)
            quads.forget()
        for first in range(0, len(steps), size):
            chunk = list(enumerate(steps[first : first + size], first))
            words = [[None, None] for _ in range(n_tok)]
            tokens = range(n_tok)
            order = (
                [(s, t) for s in chunk for t in tokens]
                if steps_outer
                else [(s, t) for t in tokens for s in chunk]
            )
            for (step, (q, part)), t in order:
                x = _broadcast_at(
                    context,
                    builder,
                    xb_type,
                    xb_array,
                    _plus(builder, row, t),
                    _plus(builder, col, q + 4 * part),
                )
                for lane in lanes:
                    c = acc[t][lane]
                    if group == 1:
                        c[step % chains] = dot(builder, c[step % chains], quads[q][lane][part], x)
                        continue
                    words[t][lane] = simd.word_dot(builder, words[t][lane], quads[q][lane][part], x)
                    if step == chunk[-1][0]:
                        c[(first // group) % chains] = simd.widen_words(
                            builder, c[(first // group) % chains], words[t][lane], by and by(lane)
                        )
        if done is not None:
            done(lanes, acc)
    return acc


def _reload_barrier(builder) -> None:  # type: ignore[no-untyped-def]
    """An empty asm that may touch memory: loads after it are not merged with those before. Between
    the two 16-row lanes of a 4-token AVX2 tile, LLVM otherwise kept lane 0's 32 broadcast activations
    for lane 1 and spilled them (161 stack accesses a block; llvm-mca, znver3)."""
    barrier = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "", "~{memory}", side_effect=True)
    builder.call(barrier, [])


def _chain_total(builder, chains):  # type: ignore[no-untyped-def]
    total = chains[0]
    for partial in chains[1:]:
        total = builder.add(total, partial)
    return total


def _chain_totals(builder, acc):  # type: ignore[no-untyped-def]
    """acc[t][lane] (a list of chains) -> their sums."""
    totals = []
    for per_lane in acc:
        row = []
        for chains in per_lane:
            total = chains[0]
            for partial in chains[1:]:
                total = builder.add(total, partial)
            row.append(total)
        totals.append(row)
    return totals


def _store_rows(context, builder, array_type, array, at, t: int, lane: int, value) -> None:  # type: ignore[no-untyped-def]
    """array[at + t * 32 + 16 * lane :][:16] = value (16 int32)."""
    index = builder.add(at, ir.Constant(ir.IntType(64), t * ROWS + lane * 16))
    builder.store(value, _vector_at(context, builder, array_type, array, index, _V16I32), align=4)


def _scaled_block_sums(
    context, builder, n_tok, chains, quads, xb_type, xb, row, col, sc, out, max_weight, whole_lanes=False
):  # type: ignore[no-untyped-def]
    """The body of _q4k_block_sums and _q5k_block_sums: quads[q] are positions 4q.. and 16 + 4q.. per
    16-row lane (unsigned bytes, 4 a row), sc = (type, array, at), out = (type, array, at); whole_lanes
    as _dpbusd_quads."""
    sc_type, sc_array, sc_at = sc

    def scales(lane: int):  # type: ignore[no-untyped-def]
        at = _plus(builder, sc_at, 16 * lane)
        return _widen_bytes16(context, builder, sc_type, sc_array, at, signed=False)

    # AVX2 widens the int16 sums by the scales (vpmaddwd by s twice a lane): the product comes free.
    by = (lambda lane: _word_pairs(builder, scales(lane))) if simd.WORD_SUMS else None

    def store(lanes, acc) -> None:  # type: ignore[no-untyped-def]
        for lane in lanes:
            factor = None if by else scales(lane)
            for t in range(n_tok):
                total = _chain_total(builder, acc[t][lane])
                scaled = total if by else builder.mul(total, factor)
                _store_rows(context, builder, out[0], out[1], out[2], t, lane, scaled)

    _dpbusd_quads(
        context,
        builder,
        n_tok,
        chains,
        quads,
        xb_type,
        xb,
        row,
        col,
        max_weight=max_weight,
        by=by,
        done=store,
        whole_lanes=whole_lanes,
    )


def _word_pairs(builder, values):  # type: ignore[no-untyped-def]
    """Each int32 lane's value (below 2^15) in both its int16 halves: vpmaddwd's factor for a row."""
    return builder.or_(values, builder.shl(values, _splat(16)))


def _q4k_block_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """Q4_K's whole block b for n_tok tokens and 32 rows, scaled in integers: out[out_at + t * 32 + r] =
    sc[sc_at + r] x sum over the 16 positions j of w[r, j] * x[t, j] + w[r, j + 16] * x[t, j + 16]
    (xb as in _quad_sums, col0 = 8b), from Q4_K's records (records.py), whose nibble bytes are stored as
    _transposed_quads' shuffle would leave them. The scale multiply is here, on whole vectors: written in
    the tile as a lane loop over a (block, token, row) array, LLVM scalarized it (32 imul a block at T =
    1)."""

    @intrinsic
    def block_sums(typingctx, out, out_at, packed, packed_at, xb, row0, col0, sc, sc_at):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            out_type, _, packed_type, _, xb_type, _, _, sc_type, _ = sig.args
            out_at, at0, row, col, sc_at = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 3, 5, 6, 8)
            )
            quads = _Quads(4, lambda q: _nibble_quads(context, builder, packed_type, args[2], at0, q, None))
            sc = (sc_type, args[7], sc_at)
            out = (out_type, args[0], out_at)
            _scaled_block_sums(
                context, builder, n_tok, chains, quads, xb_type, args[4], row, col, sc, out, 15, True
            )
            return context.get_dummy_value()

        return types.void(out, out_at, packed, packed_at, xb, row0, col0, sc, sc_at), codegen

    return block_sums


_V32I8 = ir.VectorType(ir.IntType(8), 32)
# Q5_0/Q5_1/Q5_K's qh byte c of a block and row holds the fifth bits of positions 4c + k (bit 2k) and
# 16 + 4c + k (bit 2k + 1). Spread to the 4 bytes of its row (byte 4r + k of a 16-row lane),
# vpmultishiftqb moves bit 2k (2k + 1) of byte 4r + k to bit 4 of that byte: per byte, the 8 bits of its
# qword from bit offset 8p + 2k - 4 (- 3), p the byte's place in the qword.
_ROW_BYTES = [
    ir.Constant(ir.VectorType(ir.IntType(32), 64), [16 * lane + r for r in range(16) for _ in range(4)])
    for lane in (0, 1)
]
_FIFTH_SHIFTS = [_bytes([(8 * (j % 8) + 2 * (j % 4) - 4 + high) % 64 for j in range(64)]) for high in (0, 1)]


def _fifth_bits(context, builder, qh_type, qh, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """The fifth bits of positions 4q .. 4q + 3 and 16 + 4q .. (qh bytes from qh_at0: Q5_0, Q5_1, Q5_K),
    at bit 4 of each byte, per 16-row lane."""
    at = builder.add(qh_at0, ir.Constant(ir.IntType(64), q * ROWS))
    raw = builder.load(_vector_at(context, builder, qh_type, qh, at, _V32I8), align=1)
    out = []
    for lane in (0, 1):
        rows = builder.shuffle_vector(raw, raw, _ROW_BYTES[lane])
        out.append(tuple(_bit_to_4(builder, rows, high) for high in (0, 1)))
    return out


def _bit_to_4(builder, rows, high: int):  # type: ignore[no-untyped-def]
    """Bit 2k + high of byte 4r + k, moved to bit 4 (the others cleared)."""
    if simd.TARGET.vbmi:
        shift = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V64I8, [_V64I8, _V64I8]), "llvm.x86.avx512.pmultishift.qb.512"
        )
        return builder.and_(builder.call(shift, [_FIFTH_SHIFTS[high], rows]), _bytes(0x10))
    bits = None
    for k in range(4):
        bit = 2 * k + high
        moved = builder.shl(rows, _bytes(4 - bit)) if bit < 4 else builder.lshr(rows, _bytes(bit - 4))
        part = builder.and_(moved, _bytes([0x10 if j % 4 == k else 0 for j in range(64)]))
        bits = part if bits is None else builder.or_(bits, part)
    return bits


def _q5k_block_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """_q4k_block_sums for Q5_K: the nibbles with their fifth bits (qh bytes at qh_at) are the unsigned
    5-bit weights; sc x their sum is the int16 path's sc x (sum of (q - 16) x + 16 sum(x)) exactly."""

    @intrinsic
    def block_sums(typingctx, out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            out_type, _, packed_type, _, qh_type, _, xb_type, _, _, sc_type, _ = sig.args
            out_at, at0, qh_at0, row, col, sc_at = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 3, 5, 7, 8, 10)
            )
            quads = _Quads(
                4,
                lambda q: _five_bit_quads(
                    context, builder, packed_type, args[2], at0, qh_type, args[4], qh_at0, q
                ),
            )
            sc = (sc_type, args[9], sc_at)
            out = (out_type, args[0], out_at)
            _scaled_block_sums(
                context, builder, n_tok, chains, quads, xb_type, args[6], row, col, sc, out, 31
            )
            return context.get_dummy_value()

        return types.void(out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at), codegen

    return block_sums


def _five_bit_quads(context, builder, packed_type, packed, at0, qh_type, qh, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """The unsigned 5-bit weights of quad q (Q5_0, Q5_1, Q5_K), per 16-row lane: (positions 4q..,
    16 + 4q..), the nibbles at at0 with their fifth bits from the qh bytes at qh_at0."""
    nibbles = _nibble_quads(context, builder, packed_type, packed, at0, q)
    fifths = _fifth_bits(context, builder, qh_type, qh, qh_at0, q)
    return [
        tuple(builder.or_(v, builder.bitcast(f, _V16I32)) for v, f in zip(lane, bits, strict=True))
        for lane, bits in zip(nibbles, fifths, strict=True)
    ]


def _q5_weights(context, builder, sig, args, at0, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """_five_bit_quads in _centred_half_sums' argument order (packed args[1], qh args[3])."""
    return _five_bit_quads(context, builder, sig.args[1], args[1], at0, sig.args[3], args[3], qh_at0, q)


# IQ4's levels as weight bytes: + 128 where VNNI's unsigned product takes them (simd.SIGNED_BY_OFFSET).
IQ4_OFFSET_BITS = 7 if simd.SIGNED_BY_OFFSET else 0
_IQ4_LEVEL_BYTES = _bytes(
    [(int(IQ4_LEVELS[i % 16]) + (1 << IQ4_OFFSET_BITS if IQ4_OFFSET_BITS else 0)) % 256 for i in range(64)]
)


def _iq4_weights(context, builder, sig, args, at0, qh_at0, q: int):  # type: ignore[no-untyped-def]
    """IQ4's level bytes of quad q (_IQ4_LEVEL_BYTES), per 16-row lane: one vpshufb per nibble vector."""
    out = []
    for lane in _nibble_quads(context, builder, sig.args[1], args[1], at0, q):
        levels = [simd.byte_lookup(builder, _IQ4_LEVEL_BYTES, builder.bitcast(v, _V64I8)) for v in lane]
        out.append(tuple(builder.bitcast(v, _V16I32) for v in levels))
    return out


def _centred_half_sums(n_tok: int, chains: int, weights, offset_bits: int):  # type: ignore[no-untyped-def]
    """Half a block (positions 8h .. 8h + 7 and 16 + 8h ..) of a Q4_0-layout format whose unsigned
    weight bytes are u = w + 2^offset_bits, for n_tok tokens and 32 rows: sums[t * 32 + r] = sum of
    w[r, j] * x[t, j] over the half = sum of u * x - 2^offset_bits * xh[row0 + t, 2b + h], xh the
    half's activation sum (_half_block_sums), xb as in _quad_sums (col0 = 8b + 2h). `weights` gives a
    quad's u per lane (Q5_0/Q5_1: 5-bit weights, w = q - 16; IQ4: levels + 128); `qh` may be any array
    when it does not read one. offset_bits 0: signed weight bytes (simd.dot_signed, AVX2's IQ4). The same
    integers as the int16/int32 paths, so the same outputs."""

    @intrinsic
    def half_sums(typingctx, sums, packed, packed_at, qh, qh_at, xb, row0, col0, xh, half):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, _, _, _, _, xb_type, _, _, xh_type, _ = sig.args
            at0, qh_at0, row, col, half = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 4, 6, 7, 9)
            )
            xh_array = context.make_array(xh_type)(context, builder, args[8])
            quads = _Quads(2, lambda q: weights(context, builder, sig, args, at0, qh_at0, q))
            signed = offset_bits == 0
            acc = _dpbusd_quads(
                context, builder, n_tok, chains, quads, xb_type, args[5], row, col, signed, 31
            )
            for t, per_lane in enumerate(_chain_totals(builder, acc)):
                offset = _broadcast_at(context, builder, xh_type, xh_array, _plus(builder, row, t), half)
                for lane, total in enumerate(per_lane):
                    centred = (
                        total if signed else builder.sub(total, builder.shl(offset, _splat(offset_bits)))
                    )
                    at = ir.Constant(ir.IntType(64), t * ROWS + lane * 16)
                    builder.store(
                        centred, _vector_at(context, builder, sums_type, args[0], at, _V16I32), align=4
                    )
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, qh, qh_at, xb, row0, col0, xh, half), codegen

    return half_sums


def _q6k_block_sums(n_tok: int, chains: int):  # type: ignore[no-untyped-def]
    """Q6_K's whole block b (its 16 positions at `packed_at`, their qh bytes at `qh_at`) for n_tok
    tokens and 32 rows, scaled in integers: out[out_at + t * 32 + r] = sc_lo[r] x (sum over j < 16 of
    u[r, j] * x[t, j] - 32 x16[t, 2b]) + sc_hi[r] x (the same over j + 16, - 32 x16[t, 2b + 1]), where
    u are the unsigned 6-bit weights (q - 32 = u - 32), sc_lo / sc_hi the int8 scales at sc_at and
    sc_at + 32, x16 the activations' sums per 16 and xb as in _quad_sums (col0 = 8b). The weights are in
    row quads (engine/cpu/records.py), the only layout the VNNI tiles read."""

    @intrinsic
    def q6k_sums(typingctx, out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at, x16):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            out_type, _, packed_type, _, qh_type, _, xb_type, _, _, sc_type, _, x16_type = sig.args
            out_at, at0, qh_at0, row, col, sc_at = (
                context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 3, 5, 7, 8, 10)
            )
            x16_array = context.make_array(x16_type)(context, builder, args[11])
            packed, qh = args[2], args[4]

            def quad(q: int):  # type: ignore[no-untyped-def]
                return _q6k_row_quads(context, builder, packed_type, packed, at0, qh_type, qh, qh_at0, q)

            acc = [  # weights j (the low sums), weights j + 16 (the high sums)
                [[[_splat(0) for _ in range(chains)] for _ in (0, 1)] for _ in range(n_tok)] for _ in (0, 1)
            ]
            if simd.WORD_SUMS:  # AVX2: each part's int16 pair sums in _dpbusd_quads
                quads = _Quads(4, quad)
                for part in (0, 1):
                    acc[part] = _dpbusd_quads(
                        context,
                        builder,
                        n_tok,
                        chains,
                        quads,
                        xb_type,
                        args[6],
                        row,
                        col,
                        max_weight=63,
                        parts=(part,),
                        whole_lanes=True,
                    )
            else:  # both parts per quad and token, as measured on VNNI (one part after the other: Gemma 3's
                # pp512 1.42x llama.cpp's against 1.55x)
                xb_array = context.make_array(xb_type)(context, builder, args[6])
                for q in range(4):
                    lanes = quad(q)
                    for t in range(n_tok):
                        for part in (0, 1):
                            x = _broadcast_at(
                                context,
                                builder,
                                xb_type,
                                xb_array,
                                _plus(builder, row, t),
                                _plus(builder, col, q + 4 * part),
                            )
                            for lane in (0, 1):
                                c = acc[part][t][lane]
                                c[q % chains] = simd.dot_unsigned(
                                    builder, c[q % chains], lanes[lane][part], x
                                )
            scales = [
                [
                    _widen_bytes16(
                        context,
                        builder,
                        sc_type,
                        args[9],
                        _plus(builder, sc_at, 32 * part + 16 * lane),
                        signed=True,
                    )
                    for lane in (0, 1)
                ]
                for part in (0, 1)
            ]
            totals = [_chain_totals(builder, acc[part]) for part in (0, 1)]
            # x16 column of the low sub-block: col0 / 4 (= 2b)
            x16_col = builder.ashr(col, ir.Constant(ir.IntType(64), 2))
            for t in range(n_tok):
                for lane in (0, 1):
                    value = None
                    for part in (0, 1):
                        shift = _broadcast_at(
                            context,
                            builder,
                            x16_type,
                            x16_array,
                            _plus(builder, row, t),
                            _plus(builder, x16_col, part),
                        )
                        centred = builder.sub(totals[part][t][lane], builder.shl(shift, _splat(5)))
                        scaled = builder.mul(centred, scales[part][lane])
                        value = scaled if value is None else builder.add(value, scaled)
                    _store_rows(context, builder, out_type, args[0], out_at, t, lane, value)
            return context.get_dummy_value()

        return types.void(out, out_at, packed, packed_at, qh, qh_at, xb, row0, col0, sc, sc_at, x16), codegen

    return q6k_sums


# Tiles of 8 tokens call the 4-token intrinsics twice (here and for Q4_0/Q4_1, Q4_K, Q8_0): one call
# for 8 keeps 16-32 accumulators live with the shuffled weights, and spills. Two calls of 4 against one
# of 8 (2026-12-03, 2 threads; scripts/ab_matmul.py, both alternated in one process): Q8_0 32768x640
# 0.96-0.97x the time at T = 8-64, Q4_0 and Q4_K 8960x1536 0.94-0.99x at T = 8-256; Q6_K (two
# bench_matmul.py runs, T = 16) 2.48 -> 2.09 ms.
_q6k_block_sums1 = _q6k_block_sums(1, simd.chains(4))
_q6k_block_sums2 = _q6k_block_sums(2, simd.chains(2))
_q6k_block_sums4 = _q6k_block_sums(4, simd.chains(1))
_quad_sums1 = _quad_sums(1, simd.chains(4))
_quad_sums2 = _quad_sums(2, simd.chains(2))
_quad_sums4 = _quad_sums(4, simd.chains(1))
# Whole Q4_K blocks (16 positions) of its records times their scales.
_q4k_record_sums1 = _q4k_block_sums(1, simd.chains(4))
_q4k_record_sums2 = _q4k_block_sums(2, simd.chains(2))
_q4k_record_sums4 = _q4k_block_sums(4, simd.chains(1))
_q5k_block_sums1 = _q5k_block_sums(1, simd.chains(4))
_q5k_block_sums2 = _q5k_block_sums(2, simd.chains(2))
_q5k_block_sums4 = _q5k_block_sums(4, simd.chains(1))
_q5_half_sums1 = _centred_half_sums(1, simd.chains(4), _q5_weights, 4)
_q5_half_sums2 = _centred_half_sums(2, simd.chains(2), _q5_weights, 4)
_q5_half_sums4 = _centred_half_sums(4, 1, _q5_weights, 4)
_iq4_quad_sums1 = _centred_half_sums(1, simd.chains(4), _iq4_weights, IQ4_OFFSET_BITS)
_iq4_quad_sums2 = _centred_half_sums(2, simd.chains(2), _iq4_weights, IQ4_OFFSET_BITS)
_iq4_quad_sums4 = _centred_half_sums(4, 1, _iq4_weights, IQ4_OFFSET_BITS)

# A Q8_0 block (16 position pairs) for tiles of 1 and 2 tokens, where vpdpwssd sums held in memory were
# latency-bound (2.4x slower than the float path at T = 1).
_q8_block_sums1 = _register_sums(1, 16, _int8_pairs, chains=simd.chains(4))
_q8_block_sums2 = _register_sums(2, 16, _int8_pairs, chains=simd.chains(2))


def _q8_quad_sums(n_tok: int):  # type: ignore[no-untyped-def]
    """An intrinsic computing a Q8_0 block's sums for a tile of n_tok tokens and 32 rows on vpdpbusd:
    sums[t * 32 + r] = sum over the 32 positions j of w[r, j] * x[t, j], with xb as in _quad_sums
    (col0 = 8b) and xs[row0 + t, b] the block's activation sum. vpdpbusd wants unsigned weight bytes:
    it multiplies w + 128 (the sign bit flipped), and 128 x sum(x) comes off at the end (AVX2: the
    signed bytes as they are, simd.dot_signed). Integers, so the same sums as the vpdpwssd tiles of 1
    and 2 tokens to the bit."""

    @intrinsic
    def q8_quad_sums(typingctx, sums, packed, packed_at, xb, xs, row0, b):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            sums_type, packed_type, _, xb_type, xs_type, _, _ = sig.args
            at0, row, block = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (2, 5, 6))
            col = builder.shl(block, ir.Constant(ir.IntType(64), 3))
            xb_array = context.make_array(xb_type)(context, builder, args[3])
            xs_array = context.make_array(xs_type)(context, builder, args[4])
            if simd.WORD_SUMS:
                xb = (xb_type, xb_array)
                _q8_row_set_sums(
                    context, builder, n_tok, (sums_type, args[0]), (packed_type, args[1], at0), xb, row, col
                )
                return context.get_dummy_value()
            offset = simd.SIGNED_BY_OFFSET
            dot = simd.dot_unsigned if offset else simd.dot_signed
            acc = [[[_splat(0)] for _ in (0, 1)] for _ in range(n_tok)]
            for q in range(QK // 4):
                quads = _transposed_quads(
                    context, builder, packed_type, args[1], at0, ((4 * q) * ROWS, (4 * q + 2) * ROWS)
                )
                lanes = [
                    builder.bitcast(builder.xor(rows, _bytes(0x80)) if offset else rows, _V16I32)
                    for rows in quads
                ]
                for t in range(n_tok):
                    x = _broadcast_at(
                        context, builder, xb_type, xb_array, _plus(builder, row, t), _plus(builder, col, q)
                    )
                    for lane in (0, 1):
                        acc[t][lane][0] = dot(builder, acc[t][lane][0], lanes[lane], x)
            for t in range(n_tok if offset else 0):
                offset = _broadcast_at(context, builder, xs_type, xs_array, _plus(builder, row, t), block)
                for lane in (0, 1):
                    acc[t][lane][0] = builder.sub(acc[t][lane][0], builder.shl(offset, _splat(7)))
            _store_chains(context, builder, sums_type, args[0], acc)
            return context.get_dummy_value()

        return types.void(sums, packed, packed_at, xb, xs, row0, b), codegen

    return q8_quad_sums


def _unpack(builder, a, b, width: int, high: bool):  # type: ignore[no-untyped-def]
    """vpunpck{l,h}{bw,wd}: in each 128-bit half, the low (or high) elements of a and b interleaved
    (elements of `width` bytes; a, b and the result 32 bytes)."""
    n = 32 // width
    vector = ir.VectorType(ir.IntType(8 * width), n)
    half, take = n // 2, n // 4
    mask = []
    for h in (0, 1):
        first = h * half + (take if high else 0)
        for i in range(first, first + take):
            mask += [i, n + i]
    mixed = builder.shuffle_vector(
        builder.bitcast(a, vector),
        builder.bitcast(b, vector),
        ir.Constant(ir.VectorType(ir.IntType(32), n), mask),
    )
    return builder.bitcast(mixed, _V8I32)


_V8I32 = ir.VectorType(ir.IntType(32), 8)
_V32I8 = ir.VectorType(ir.IntType(8), 32)
# Rows of a row set's <16 x i32> sums, in lane order (set 1: each + 8): the unpacks leave rows 0-3 and
# 16-19 in the first ymm, 4-7 and 20-23 in the second.
_SET_ROWS = [0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23]


def _q8_row_set_sums(context, builder, n_tok, sums, packed, xb, row, col) -> None:  # type: ignore[no-untyped-def]
    """AVX2's Q8_0 block sums for a tile of n_tok tokens, into sums[t * 32 + r] as _q8_quad_sums: the
    4 positions of a quad (32 row bytes each) transposed into row quads by in-lane unpacks (bytes, then
    words: 4 instructions for 16 rows), one row set of 16 rows (0-7 and 16-23, then 8-15 and 24-31) at a
    time so a set's 4 x 2 ymm of sums stay in registers. The cross-lane shuffle of _transposed_quads
    cost 11 instructions a lane, and both lanes' sums of 4 tokens spilled (llvm-mca, znver3: 458 cycles
    for two blocks of 4 tokens, 514 stack accesses)."""
    (sums_type, sums_array), (packed_type, packed_array, at0), (xb_type, xb_array) = sums, packed, xb
    for row_set in (0, 1):
        if row_set:
            _reload_barrier(builder)
        acc = [_splat(0) for _ in range(n_tok)]
        for q in range(QK // 4):
            positions = [
                builder.load(
                    _vector_at(
                        context,
                        builder,
                        packed_type,
                        packed_array,
                        _plus(builder, at0, (4 * q + i) * ROWS),
                        _V32I8,
                    ),
                    align=1,
                )
                for i in range(4)
            ]
            pairs = [_unpack(builder, positions[i], positions[i + 1], 1, bool(row_set)) for i in (0, 2)]
            quads = [_unpack(builder, pairs[0], pairs[1], 2, high) for high in (False, True)]
            weights = builder.shuffle_vector(quads[0], quads[1], ir.Constant(_V16I32, list(range(16))))
            for t in range(n_tok):
                x = _broadcast_at(
                    context, builder, xb_type, xb_array, _plus(builder, row, t), _plus(builder, col, q)
                )
                acc[t] = simd.dot_signed(builder, acc[t], weights, x)
        for t in range(n_tok):
            for part in (0, 1):  # rows 8 row_set + 0..7, then 16 + 8 row_set + 0..7
                lanes = ir.Constant(_V8I32, [_SET_ROWS.index(r + 16 * part) for r in range(8)])
                value = builder.shuffle_vector(acc[t], acc[t], lanes)
                at = ir.Constant(ir.IntType(64), t * ROWS + 16 * part + 8 * row_set)
                builder.store(value, _vector_at(context, builder, sums_type, sums_array, at, _V8I32), align=4)


# Tiles of 4 and 8 tokens: vpdpbusd does twice vpdpwssd's multiplies per instruction, and the sums stay
# in registers. Against the vpdpwssd sums held in memory they replaced (scripts/ab_matmul.py --rev
# 75fecee, 32768x512, 2 threads, 2026-12-03): 0.84x the time at T = 8 and 16, 0.69x at T = 64.
_q8_quad_sums4 = _q8_quad_sums(4)
