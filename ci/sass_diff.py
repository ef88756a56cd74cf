#!/usr/bin/env python3
"""Proves that a change to the CUDA sources changed no kernel, without a GPU.

  ci/sass_diff.py snapshot DIR [--build build/cuda]   (before the change)
  ci/sass_diff.py compare DIR [--build build/cuda]    (after it; exit 1 on any difference)

snapshot recompiles every .cu of the build's compile_commands.json with its own command line
plus `-keep` (the cubins nvcc embeds in the objects, bit for bit) and stores, per kernel, the
machine code (the ELF section .text.<kernel>: every SASS instruction's encoding), its
relocations, .nv.info.<kernel> (registers, barriers, parameter layout, ...), the sizes of its
shared-memory and constant-bank sections, and ptxas's -v figures (registers, spills, stack).
compare does the same for the tree as it is now, diffs them kernel by kernel, and checks that
each kernel's code stands verbatim in the build's object (build the CUDA objects first). Kernel
names are compared with cudafe's per-file anonymous-namespace tag normalised. No cuobjdump or
nvdisasm is needed (the CI image has neither); equal encodings are a stricter test than equal
disassembly. DIR and --build are relative to the repository root; nvcc runs one file at a time
(about a minute for all of optimized/cuda on 2 cores).
"""
import argparse, json, os, re, shlex, struct, subprocess, sys, tempfile

ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_(\w+?)_cu_[0-9a-f]+")


def norm(name):
    return ANON.sub(r"_GLOBAL__N__\1_cu", name)


def elf_sections(data):
    """{name: (type, info, bytes or size)} of a 64-bit little-endian ELF (a cubin)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stroff = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name_off, typ, _, _, off, size, _, info = h[:8]
        end = data.index(b"\0", stroff + name_off)
        name = data[stroff + name_off:end].decode()
        out[name] = (typ, info, data[off:off + size] if typ != 8 else size)  # 8: NOBITS
    return out


def symbols(secs):
    strtab = secs[".strtab"][2]
    symtab = secs[".symtab"][2]
    names = []
    for i in range(0, len(symtab), 24):
        st_name, = struct.unpack_from("<I", symtab, i)
        names.append(norm(strtab[st_name:strtab.index(b"\0", st_name)].decode()))
    return names


def kernels_of(cubin):
    secs = elf_sections(open(cubin, "rb").read())
    syms = symbols(secs)
    res = {}
    for name, (typ, info, body) in secs.items():
        if not name.startswith(".text."):
            continue
        k = name[len(".text."):]
        rela = secs.get(".rela.text." + k, (0, 0, b""))[2]
        entries = (struct.unpack_from("<QQq", rela, i) for i in range(0, len(rela), 24))
        relocs = [(off, t & 0xFFFFFFFF, syms[t >> 32], add) for off, t, add in entries]
        res[norm(k)] = {
            "text": body.hex(),
            "text_info": info,  # register count etc. in the section header
            "relocs": relocs,
            "nv_info": secs.get(".nv.info." + k, (0, 0, b""))[2].hex(),
            "shared": secs.get(".nv.shared." + k, (0, 0, 0))[2],
            "constant0": len(secs.get(".nv.constant0." + k, (0, 0, b""))[2]),
        }
    return res


def ptxas_figures(log):
    """{kernel: 'Used N registers ... / spill figures'} from ptxas -v output."""
    figs, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line) or re.search(
            r"Compiling entry function '(\S+)'", line)
        if m:
            cur = norm(m.group(1))
        elif cur and ("bytes stack frame" in line or "Used" in line):
            figs.setdefault(cur, []).append(line.split(":", 1)[-1].strip())
    return figs


def collect(build):
    cc = json.load(open(os.path.join(build, "compile_commands.json")))
    result = {}
    for e in cc:
        src = e["file"]
        if not src.endswith(".cu"):
            continue
        stem = os.path.basename(src)[:-3]
        with tempfile.TemporaryDirectory() as tmp:
            args = shlex.split(e["command"])
            i = args.index("-o")
            args[i + 1] = os.path.join(tmp, stem + ".o")
            args += ["-keep", "-keep-dir", tmp]
            if "-Xptxas=-v" not in args:
                args.append("-Xptxas=-v")
            p = subprocess.run(args, cwd=e["directory"], capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"compile of {src} failed:\n{p.stderr}")
            cubins = sorted(f for f in os.listdir(tmp) if f.endswith(".cubin"))
            for c in cubins:
                for k, v in kernels_of(os.path.join(tmp, c)).items():
                    result[f"{stem}/{c}/{k}"] = v
            figs = ptxas_figures(p.stderr)
            for key, v in result.items():
                if key.startswith(stem + "/"):
                    v["ptxas"] = figs.get(key.rsplit("/", 1)[1], [])
        print(f"{stem}: {sum(k.startswith(stem + '/') for k in result)} kernels", file=sys.stderr)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["snapshot", "compare"])
    ap.add_argument("dir")
    ap.add_argument("--build", default="build/cuda")
    a = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    path = os.path.join(a.dir, "kernels.json")
    if a.mode == "compare" and not os.path.exists(path):
        sys.exit(f"no snapshot at {path}: run `ci/sass_diff.py snapshot {a.dir}` before the change")
    now = collect(a.build)
    if a.mode == "snapshot":
        os.makedirs(a.dir, exist_ok=True)
        json.dump(now, open(path, "w"))
        print(f"{len(now)} kernels stored in {path}")
        return 0
    old = json.load(open(path))
    now = json.loads(json.dumps(now))  # tuples -> lists, as stored
    bad = 0
    for k in sorted(set(old) | set(now)):
        if k not in old or k not in now:
            print(f"ONLY {'AFTER' if k in now else 'BEFORE'}: {k}")
            bad += 1
            continue
        diff = [f for f in old[k] if old[k][f] != now[k].get(f)]
        n = len(old[k]["text"]) // 32  # 16-byte SASS instructions
        figs = "; ".join(now[k]["ptxas"])
        print(f"{'same ' if not diff else 'DIFF '} {k} ({n} instructions; {figs})"
              + (f" differs in: {', '.join(diff)}" if diff else ""))
        bad += bool(diff)
    n_diff = bad
    # The -keep cubins are the ones the build embeds: each kernel's code must stand verbatim in
    # the build's object of its source (fails when the objects are stale: build them first).
    objs = {}
    for root, _, files in os.walk(a.build):
        for f in files:
            if f.endswith(".cu.o"):
                objs[f[:-5]] = open(os.path.join(root, f), "rb").read()
    missing = [k for k in now
               if bytes.fromhex(now[k]["text"]) not in objs.get(k.split("/")[0], b"")]
    for k in missing:
        print(f"NOT IN THE BUILD'S OBJECT (stale build?): {k}")
    bad += len(missing)
    print(f"{len(now) - len(missing)} of {len(now)} kernels' code found verbatim in "
          f"{a.build}'s objects")
    print(f"{len(set(old) | set(now))} kernels compared: "
          + ("machine code, relocations, .nv.info and ptxas -v figures identical" if not bad
             else f"{n_diff} DIFFERENT or missing, {len(missing)} not in the build's objects"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
