"""The x86 level the CPU kernels are built for, read from the target Numba compiles for.

Levels, best first: `avx512-vnni` (512-bit vpdpbusd / vpdpwssd), `avx-vnni` (their 256-bit VEX form,
Intel Alder Lake and newer), `avx2` (vpmaddubsw + vpmaddwd on 256-bit vectors, FMA, F16C) and
`portable` (no x86 intrinsic: the int16 kernels LLVM vectorizes for whatever it targets). The kernels
emit a level's instructions only (engine/cpu/simd.py), so a kernel for an instruction set the target
lacks is never compiled: LLVM aborts the process on such an intrinsic, it does not raise.

The level follows the compile target, not /proc/cpuinfo: Numba targets NUMBA_CPU_NAME with
NUMBA_CPU_FEATURES, by default the host CPU. `configure` (run by engine/__init__.py before Numba loads)
makes two choices of its own there:
- NUMBA_CPU_NAME alone means that CPU's own features (Numba would keep the host's: NUMBA_CPU_NAME=haswell
  on an AVX-512 machine would still compile AVX-512);
- LLAMBA_CPU_LEVEL=avx2 (any level's name) picks a level by setting both: the psABI level x86-64-v3
  for AVX2 (what llama.cpp's -DGGML_NATIVE=OFF -DGGML_AVX2=ON build targets), plus +avxvnni for
  avx-vnni, x86-64-v4 plus +avx512vnni for avx512-vnni, x86-64 (SSE2) for portable.

What the target has is asked of LLVM itself (`target_features`): a few lines of IR compiled for the
target, whose assembly shows whether it selected the instruction (a 256-bit vpmulld, vfmadd,
vcvtph2ps, a zmm byte add, vpdpwssd on zmm or {vex} on ymm, vpermt2b). So any CPU name LLVM knows is
read right, and the check that the machine can run the target (`current`) compares the same probes
on the host (`host_features`). Both cost ~0.1 s once per process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import MutableMapping

LEVEL_ENV = "LLAMBA_CPU_LEVEL"


@dataclasses.dataclass(frozen=True)
class Level:
    name: str
    needs: frozenset[str]  # target features (the probes' names) the level's kernels use
    cpu: str  # the LLVM target LLAMBA_CPU_LEVEL sets for it
    features: str

    @property
    def byte_dot(self) -> bool:
        """Whether the byte dot-product kernels (row quads, records) run: every level but portable."""
        return self.name != "portable"


LEVELS = (
    Level(
        "avx512-vnni",
        frozenset({"avx2", "fma", "f16c", "avx512bw", "avx512vnni"}),
        "x86-64-v4",
        "+avx512vnni",
    ),
    Level("avx-vnni", frozenset({"avx2", "fma", "f16c", "avxvnni"}), "x86-64-v3", "+avxvnni"),
    Level("avx2", frozenset({"avx2", "fma", "f16c"}), "x86-64-v3", ""),
    Level("portable", frozenset(), "x86-64", ""),
)
LEVEL_NAMES = tuple(level.name for level in LEVELS)


class UnsupportedTarget(RuntimeError):
    """The compile target (or the level asked for) needs instructions this CPU does not have."""


def level_named(name: str) -> Level:
    for level in LEVELS:
        if level.name == name:
            return level
    raise UnsupportedTarget(f"{LEVEL_ENV}={name!r} is no level; the levels are {', '.join(LEVEL_NAMES)}")


def configure(env: MutableMapping[str, str] = os.environ) -> None:
    """Point Numba's target at LLAMBA_CPU_LEVEL's, or at NUMBA_CPU_NAME's own features; before Numba
    reads its configuration (engine/__init__.py). Raises nothing: `current` reports what is wrong."""
    name = env.get(LEVEL_ENV)
    if name in LEVEL_NAMES and "NUMBA_CPU_NAME" not in env and "NUMBA_CPU_FEATURES" not in env:
        level = level_named(name)
        env["NUMBA_CPU_NAME"], env["NUMBA_CPU_FEATURES"] = level.cpu, level.features
    elif not name and "NUMBA_CPU_NAME" in env:
        env.setdefault("NUMBA_CPU_FEATURES", "")


def _asked_level(env: MutableMapping[str, str]) -> Level | None:
    """LLAMBA_CPU_LEVEL's level, checked against the target `configure` set for it."""
    name = env.get(LEVEL_ENV)
    if not name:
        return None
    level = level_named(name)
    if (env.get("NUMBA_CPU_NAME"), env.get("NUMBA_CPU_FEATURES")) != (level.cpu, level.features):
        raise UnsupportedTarget(
            f"{LEVEL_ENV} and NUMBA_CPU_NAME / NUMBA_CPU_FEATURES both set: set one or the other"
        )
    return level


# Each probe: IR for one function @f, and what its assembly shows when the target has the feature.
_MUL_I32 = "%v = load <8 x i32>, ptr %p\n%w = mul <8 x i32> %v, %v\nstore <8 x i32> %w, ptr %p"
_FMA = (
    "%v = load <8 x float>, ptr %p\n"
    "%w = call <8 x float> @llvm.fma.v8f32(<8 x float> %v, <8 x float> %v, <8 x float> %v)\n"
    "store <8 x float> %w, ptr %p"
)
_F16 = "%v = load <8 x half>, ptr %p\n%w = fpext <8 x half> %v to <8 x float>\nstore <8 x float> %w, ptr %p"
_ADD_I8 = "%v = load <64 x i8>, ptr %p\n%w = add <64 x i8> %v, %v\nstore <64 x i8> %w, ptr %p"
_PERMUTE = (
    "%v = load <64 x i8>, ptr %p\n%u = load <64 x i8>, ptr %q\n"
    "%w = shufflevector <64 x i8> %v, <64 x i8> %u, <64 x i32> <{mask}>\nstore <64 x i8> %w, ptr %p"
)


def _pairs_ir(n: int) -> str:
    """acc + (even + odd products of two int16 vectors): what vpmaddwd computes, and VNNI's vpdpwssd."""
    v16, v32 = f"<{2 * n} x i16>", f"<{2 * n} x i32>"
    even = ", ".join(f"i32 {2 * i}" for i in range(n))
    odd = ", ".join(f"i32 {2 * i + 1}" for i in range(n))
    return (
        f"%a = load {v16}, ptr %p\n%b = load {v16}, ptr %q\n%c = load <{n} x i32>, ptr %p\n"
        f"%ae = sext {v16} %a to {v32}\n%be = sext {v16} %b to {v32}\n%m = mul {v32} %ae, %be\n"
        f"%e = shufflevector {v32} %m, {v32} poison, <{n} x i32> <{even}>\n"
        f"%o = shufflevector {v32} %m, {v32} poison, <{n} x i32> <{odd}>\n"
        f"%s = add <{n} x i32> %e, %o\n%t = add <{n} x i32> %s, %c\nstore <{n} x i32> %t, ptr %p"
    )


_PROBES: dict[str, tuple[str, int, tuple[str, ...]]] = {  # feature: (body, legal vector bits, asm shows)
    "avx2": (_MUL_I32, 256, ("vpmulld", "ymm")),
    "fma": (_FMA, 256, ("vfmadd",)),
    "f16c": (_F16, 256, ("vcvtph2ps",)),
    "avx512bw": (_ADD_I8, 512, ("vpaddb", "zmm")),
    "avx512vnni": (_pairs_ir(16), 512, ("vpdpwssd", "zmm")),
    "avxvnni": (_pairs_ir(8), 256, ("{vex}", "vpdpwssd")),
    "avx512vbmi": (
        _PERMUTE.format(mask=", ".join(f"i32 {(37 * i + 11) % 128}" for i in range(64))),
        512,
        ("vpermt2b",),
    ),
}
FEATURES = tuple(_PROBES)


def _has(machine, body: str, bits: int, shows: tuple[str, ...]) -> bool:  # type: ignore[no-untyped-def]
    from llvmlite import binding as llvm

    ir = (
        "declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)\n"
        f'define void @f(ptr %p, ptr %q) "min-legal-vector-width"="{bits}" {{\n{body}\nret void\n}}'
    )
    module = llvm.parse_assembly(ir)
    module.triple = machine.triple
    asm = machine.emit_assembly(module)
    if "vpermt2b" in shows:  # either operand order
        return "vpermt2b" in asm or "vpermi2b" in asm
    return all(s in asm for s in shows)


@functools.cache
def probe(cpu: str, features: str) -> frozenset[str]:
    """The FEATURES LLVM uses when it compiles for (cpu, features)."""
    from llvmlite import binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    machine = target.create_target_machine(cpu=cpu, features=features, opt=2)
    return frozenset(f for f, (body, bits, shows) in _PROBES.items() if _has(machine, body, bits, shows))


def _host() -> tuple[str, str]:
    from llvmlite import binding as llvm

    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def target(env: MutableMapping[str, str] = os.environ) -> tuple[str, str]:
    """(cpu, features) as Numba's codegen builds its target machine from the same variables."""
    host_cpu, host_features = _host()
    cpu = env.get("NUMBA_CPU_NAME") or host_cpu
    features = env.get("NUMBA_CPU_FEATURES")
    if features is None:
        features = "" if cpu.lower() == "generic" else host_features
    return cpu, features


def level_of(features: frozenset[str]) -> Level:
    return next(level for level in LEVELS if level.needs <= features)


@dataclasses.dataclass(frozen=True)
class Target:
    cpu: str
    features: frozenset[str]
    level: Level

    @property
    def vbmi(self) -> bool:
        return self.level.name == "avx512-vnni" and "avx512vbmi" in self.features

    def describe(self) -> str:
        """One line in the manner of llama.cpp's `CPU : AVX2 = 1 | ...`."""
        flags = " | ".join(f"{f.upper()} = {int(f in self.features)}" for f in FEATURES)
        return f"CPU : level {self.level.name} (target {self.cpu}) | {flags}"


@functools.cache
def current() -> Target:
    """The target this process's kernels compile for; UnsupportedTarget where the CPU cannot run it."""
    asked = _asked_level(os.environ)
    cpu, features = target()
    found = probe(cpu, features)
    missing = found - host_features()
    if missing:
        asked_by = " ".join(
            f"{k}={os.environ[k]!r}"
            for k in (LEVEL_ENV, "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")
            if k in os.environ
        )
        raise UnsupportedTarget(
            f"the compile target {cpu} ({asked_by}) needs {', '.join(sorted(missing))}, "
            f"which this CPU ({_host()[0]}) does not have"
        )
    level = level_of(found)
    if asked is not None and asked != level:  # LLVM gave the level's target other features than planned
        raise UnsupportedTarget(f"{LEVEL_ENV}={asked.name}: its target {cpu} compiles for {level.name}")
    return Target(cpu, found, level)


def host_features() -> frozenset[str]:
    """The FEATURES of the host CPU itself, whatever this process targets."""
    return probe(*_host())
