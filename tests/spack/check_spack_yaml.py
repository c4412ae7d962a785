#!/usr/bin/env python3
"""Check spack.yaml without Spack (ctest spack_yaml, label unit; stdlib only).

  tests/spack/check_spack_yaml.py [spack.yaml] [--packages tests/spack/spack_packages.json]
  tests/spack/check_spack_yaml.py tests/spack/bad-spack.yaml --expect REGEX ...   (self-test)

* parses the YAML with a small parser for the subset spack.yaml uses (block
  mappings and sequences, flow lists, comments); if PyYAML happens to be
  importable, its parse must agree;
* parses every root spec, the commented "# GPU: - spec" alternatives and the
  packages: require: specs (name@versions +v ~v key=value ^dep %compiler);
* checks each package, variant and value against tests/spack/spack_packages.json
  (copied from the spack/spack-packages recipes named there), and the recipe
  constraints wlb4d depends on (see RULES below).
Exit status 0 when everything holds; otherwise one line per problem and 1.
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- YAML subset ----------------------------------------------------------------
def _strip_comment(line):
    out, quote = [], None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            break
        out.append(ch)
    return "".join(out).rstrip()


def _scalar(text):
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        return [_flow_item(x) for x in inner.split(",")] if inner else []
    if t in ("true", "True"):
        return True
    if t in ("false", "False"):
        return False
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    return t


def _flow_item(text):
    t = text.strip()
    m = re.match(r"^([^'\"][^:]*):(?:\s+(.*))?$", t)
    if m:  # as in YAML: "a@1:" in a flow list is the mapping {a@1: null}
        return {m.group(1): _scalar(m.group(2)) if m.group(2) else None}
    return _scalar(t)


def parse_yaml(text):
    lines = []
    for raw in text.splitlines():
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError("tab in indentation: %r" % raw)
        s = _strip_comment(raw)
        if s.strip():
            lines.append((len(s) - len(s.lstrip()), s.strip()))
    pos = [0]

    def block(indent):
        if pos[0] >= len(lines):
            return None
        ind, s = lines[pos[0]]
        if s.startswith("- ") or s == "-":
            return seq(ind)
        return mapping(ind)

    def kv(s):
        m = re.match(r"^([^:]+?):(?:\s+(.*))?$", s)
        if not m:
            raise ValueError("expected 'key: value', got %r" % s)
        return m.group(1).strip(), m.group(2)

    def mapping(indent):
        out = {}
        while pos[0] < len(lines):
            ind, s = lines[pos[0]]
            if ind < indent:
                break
            if ind > indent:
                raise ValueError("bad indentation at %r" % s)
            if s.startswith("- "):
                break
            key, val = kv(s)
            pos[0] += 1
            if val is None or val == "":
                nxt = lines[pos[0]] if pos[0] < len(lines) else None
                if nxt and (nxt[0] > indent or (nxt[0] == indent and nxt[1].startswith("- "))):
                    out[key] = block(nxt[0])
                else:
                    out[key] = None
            else:
                out[key] = _scalar(val)
        return out

    def seq(indent):
        out = []
        while pos[0] < len(lines):
            ind, s = lines[pos[0]]
            if ind != indent or not s.startswith("-"):
                break
            item = s[1:].strip()
            if re.match(r"^[^\s'\"\[][^:]*:(\s|$)", item):  # "- key: value" starts a mapping
                lines[pos[0]] = (indent + 2, item)
                out.append(mapping(indent + 2))
            else:
                pos[0] += 1
                out.append(_scalar(item))
        return out

    doc = block(lines[0][0]) if lines else None
    if pos[0] != len(lines):
        raise ValueError("unparsed line: %r" % (lines[pos[0]][1],))
    return doc


# ---- specs -------------------------------------------------------------------------
TOKEN = re.compile(
    r"\s*(?:(?P<dep>\^)|(?P<comp>%[\w.\-]+(?:@[\w.:,\-]+)?)|(?P<ver>@[\w.:,\-]+)|"
    r"(?P<bool>[+~][\w\-]+)|(?P<kv>[\w\-]+==?[\w.,:\-]+)|(?P<name>[\w\-]+))"
)


def parse_spec(text):
    """'name@v +a ~b k=v ^dep@w +c' -> list of nodes {name, versions, variants{}, compiler}."""
    nodes, cur, i = [], None, 0
    text = text.strip()
    while i < len(text):
        m = TOKEN.match(text, i)
        if not m or m.end() == i:
            raise ValueError("cannot parse spec %r at %r" % (text, text[i:]))
        i = m.end()
        kind = m.lastgroup
        tok = m.group(kind)
        if kind == "dep":
            cur = None
            continue
        if kind == "name" and cur is None:
            cur = {"name": tok, "versions": None, "variants": {}, "compiler": None}
            nodes.append(cur)
            continue
        if cur is None:
            raise ValueError("spec %r: %r before a package name" % (text, tok))
        if kind == "name":
            raise ValueError("spec %r: stray word %r (two package names without ^?)" % (text, tok))
        if kind == "ver":
            cur["versions"] = tok[1:]
        elif kind == "comp":
            cur["compiler"] = tok[1:]
        elif kind == "bool":
            cur["variants"][tok[1:]] = tok[0] == "+"
        elif kind == "kv":
            k, v = re.split(r"==?", tok, maxsplit=1)
            cur["variants"][k] = v.split(",")
    if not nodes:
        raise ValueError("empty spec")
    return nodes


def _vkey(v):
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\-]", v)]


def _le_upper(v, hi):  # Spack: ":4.7" includes 4.7.x
    return _vkey(v) <= _vkey(hi) or v == hi or v.startswith(hi + ".")


def version_in(v, ranges):
    for r in ranges.split(","):
        if ":" in r:
            lo, hi = r.split(":", 1)
            if (not lo or _vkey(v) >= _vkey(lo)) and (not hi or _le_upper(v, hi)):
                return True
        elif v == r or v.startswith(r + "."):
            return True
    return False


def lower_bound(ranges):
    r = ranges.split(",")[0]
    return r.split(":", 1)[0] if r else ""


# ---- checks -------------------------------------------------------------------------
class Checker:
    def __init__(self, db):
        self.db = db
        self.errors = []

    def err(self, where, msg):
        self.errors.append("%s: %s" % (where, msg))

    def check_node(self, where, node):
        if node["name"] in self.db.get("virtuals", {}):
            if node["variants"]:
                self.err(where, "'%s' is a virtual package: it has no variants (give them on its provider)"
                         % node["name"])
            return
        pk = self.db["packages"].get(node["name"])
        if pk is None:
            self.err(where, "'%s' is not a known Spack package (tests/spack/spack_packages.json)" % node["name"])
            return
        if node["versions"] and pk.get("versions"):
            if not any(version_in(v, node["versions"]) for v in pk["versions"]):
                self.err(where, "%s@%s matches no version of the recipe (%s)"
                         % (node["name"], node["versions"], ", ".join(pk["versions"][-6:])))
        for var, val in node["variants"].items():
            spec = pk["variants"].get(var)
            if spec is None:
                self.err(where, "%s has no variant '%s' (known: %s)"
                         % (node["name"], var, " ".join(sorted(pk["variants"])) or "none"))
                continue
            if isinstance(spec, dict):
                for cond in spec.get("when", []):
                    if not node["variants"].get(cond[1:]) is (cond[0] == "+"):
                        self.err(where, "%s variant '%s' exists only with %s" % (node["name"], var, cond))
                single = spec.get("single", False)
                spec = spec["values"]
            else:
                single = False
            allowed = self.db["cuda_arch_values"] if spec == "cuda_arch" else spec
            if allowed == "bool":
                if not isinstance(val, bool):
                    self.err(where, "%s variant '%s' is boolean: write +%s or ~%s" % (node["name"], var, var, var))
            else:
                if isinstance(val, bool):
                    self.err(where, "%s variant '%s' takes a value (%s)" % (node["name"], var, ",".join(allowed)))
                    continue
                for x in val:
                    if x not in allowed:
                        self.err(where, "%s %s=%s: not one of %s" % (node["name"], var, x, ",".join(allowed)))
                if single and len(val) > 1:
                    self.err(where, "%s %s is single-valued" % (node["name"], var))

    def check_spec(self, where, text):
        try:
            nodes = parse_spec(text)
        except ValueError as e:
            self.err(where, str(e))
            return None
        for n in nodes:
            self.check_node(where, n)
        return nodes


def on(node, var, default=False):
    return node["variants"].get(var, default) is True


def rules(chk, roots, gpu):
    """Recipe constraints (see the header of spack.yaml for their sources)."""
    by = {}
    for where, nodes in roots:
        by.setdefault(nodes[0]["name"], (where, nodes[0]))
    gby = {}
    for where, nodes in gpu:
        gby.setdefault(nodes[0]["name"], (where, nodes[0]))
    db = chk.db
    for name in db["required_roots"]:
        if name not in by:
            chk.err("spack.yaml specs", "missing root spec '%s'" % name)
    for name in db["required_gpu_roots"]:
        if name not in gby:
            chk.err("spack.yaml specs", "missing '# GPU: - %s ...' alternative" % name)

    def kokkos_rules(where, k, gpu_line):
        if k["versions"] and _vkey(lower_bound(k["versions"]) or "0") < _vkey("4.7.01"):
            chk.err(where, "kokkos@%s: needs 4.7.01 or newer (conflicts('^cuda@13:', when='@:4.7.0'); "
                    "clusters use Kokkos >= 4.7)" % k["versions"])
        if not (on(k, "openmp") or on(k, "serial") or on(k, "threads")):
            chk.err(where, "kokkos needs a host backend (+serial, +openmp or +threads)")
        if on(k, "cuda"):
            if not (on(k, "wrapper") or on(k, "cmake_lang") or (k["compiler"] or "").startswith(("clang", "cce"))):
                chk.err(where, "kokkos +cuda needs +wrapper (InstallError without %clang/%cce/+cmake_lang)")
            if "cuda_arch" not in k["variants"]:
                chk.err(where, "kokkos +cuda needs cuda_arch=<sm> (default none conflicts with +cuda)")
        if gpu_line and not on(k, "cuda"):
            chk.err(where, "the GPU kokkos line lacks +cuda")

    def kk_rules(where, kk, k, kwhere):
        if on(kk, "lapack") and not on(kk, "blas"):
            chk.err(where, "kokkos-kernels +lapack needs +blas (conflicts('+lapack', when='~blas'))")
        if k is not None and kk["versions"] and k["versions"]:
            vers = db["packages"]["kokkos-kernels"]["versions"]
            if not any(version_in(v, kk["versions"]) and version_in(v, k["versions"]) for v in vers):
                chk.err(where, "kokkos-kernels@%s pins kokkos to its own version: no overlap with kokkos@%s (%s)"
                        % (kk["versions"], k["versions"], kwhere))
        for b in ("openmp", "serial", "threads", "cuda"):
            if on(kk, b) and k is not None and not on(k, b):
                chk.err(where, "kokkos-kernels +%s needs kokkos +%s (%s)" % (b, b, kwhere))
        if on(kk, "cuda") and k is not None:
            if kk["versions"] and kk["versions"].startswith("4") and not on(k, "cuda_lambda"):
                chk.err(kwhere, "kokkos-kernels@4 +cuda depends on kokkos +cuda_lambda: say it on the kokkos line")
            if k["variants"].get("cuda_arch") != kk["variants"].get("cuda_arch"):
                chk.err(where, "kokkos-kernels cuda_arch differs from kokkos' (%s vs %s)"
                        % (kk["variants"].get("cuda_arch"), k["variants"].get("cuda_arch")))
        if on(kk, "cublas") and not on(kk, "cuda"):
            chk.err(where, "kokkos-kernels +cublas without +cuda links cuBLAS into a host build")

    if "kokkos" in by:
        kokkos_rules(by["kokkos"][0], by["kokkos"][1], False)
    if "kokkos" in gby:
        kokkos_rules(gby["kokkos"][0], gby["kokkos"][1], True)
    if "kokkos-kernels" in by:
        kk_rules(by["kokkos-kernels"][0], by["kokkos-kernels"][1], by.get("kokkos", (None, None))[1],
                 by.get("kokkos", ("?",))[0])
    if "kokkos-kernels" in gby:
        kk_rules(gby["kokkos-kernels"][0], gby["kokkos-kernels"][1], gby.get("kokkos", (None, None))[1],
                 gby.get("kokkos", ("?",))[0])
    if "nccl" in gby:
        where, n = gby["nccl"]
        if n["variants"].get("cuda") is False:
            chk.err(where, "nccl conflicts with ~cuda")
        if "cuda_arch" not in n["variants"]:
            chk.err(where, "nccl needs cuda_arch (conflicts('cuda_arch=none'))")
        if "kokkos" in gby and gby["kokkos"][1]["variants"].get("cuda_arch") != n["variants"].get("cuda_arch"):
            chk.err(where, "nccl cuda_arch differs from the GPU kokkos line's")
    if "hdf5" in by:
        where, h = by["hdf5"]
        if not on(h, "mpi", True):
            chk.err(where, "hdf5 must be +mpi (wlb4d writes checkpoints collectively; configure fails on serial HDF5)")
        mp = [n for w, ns in roots for n in ns if n["name"] == "mpich"]
        for n in mp:
            if n["versions"] and not _vkey(lower_bound(n["versions"]) or "0") >= _vkey("4.1"):
                chk.err(where, "hdf5+mpi conflicts with mpich@4.0:4.0.3: require mpich@4.1: (got mpich@%s)"
                        % n["versions"])
    if "boost" in by and not on(by["boost"][1], "program_options"):
        chk.err(by["boost"][0], "boost needs +program_options (a compiled component)")


def main(argv):
    path = os.path.join(HERE, "..", "..", "spack.yaml")
    dbpath = os.path.join(HERE, "spack_packages.json")
    args = list(argv)
    expect = []  # --expect REGEX (repeatable): self-test on a broken file, pass iff every REGEX is reported
    while "--expect" in args:
        i = args.index("--expect")
        expect.append(args[i + 1])
        del args[i:i + 2]
    if "--packages" in args:
        i = args.index("--packages")
        dbpath = args[i + 1]
        del args[i:i + 2]
    if args:
        path = args[0]
    text = open(path).read()
    db = json.load(open(dbpath))
    chk = Checker(db)
    try:
        doc = parse_yaml(text)
    except ValueError as e:
        print("%s: YAML: %s" % (path, e))
        return 1
    try:
        import yaml  # optional cross-check (python3-yaml)
        ref = yaml.safe_load(text)
        if ref != doc:
            chk.err(path, "the YAML subset parser and PyYAML disagree:\n  %r\n  %r" % (doc, ref))
        else:
            print("PyYAML %s agrees with the subset parser" % yaml.__version__)
    except ImportError:
        print("PyYAML not importable: subset parser only")

    sp = doc.get("spack") if isinstance(doc, dict) else None
    if not isinstance(sp, dict):
        print("%s: no top-level 'spack:' mapping" % path)
        return 1
    for key in sp:
        if key not in ("specs", "concretizer", "view", "packages", "include", "config", "mirrors",
                       "repos", "compilers", "modules", "definitions", "develop", "upstreams", "toolchains"):
            chk.err(path, "unknown key spack:%s" % key)
    specs = sp.get("specs") or []
    if not isinstance(specs, list):
        chk.err(path, "spack:specs must be a list of spec strings")
        specs = []
    for s in specs:
        if isinstance(s, dict):
            chk.err(path, "spec %r is a YAML mapping, not a string: a spec ending in ':' (open version "
                    "range) or containing ': ' must be quoted, e.g. - \"cmake@3.22:\"" % (s,))
    specs = [s for s in specs if isinstance(s, str)]
    roots = []
    for s in specs:
        n = chk.check_spec("spec '%s'" % s, s)
        if n:
            roots.append(("spec '%s'" % s, n))
    # The documented GPU alternatives: '# GPU: - spec' lines.
    gpu = []
    for line in text.splitlines():
        m = re.match(r"^\s*#\s*GPU:\s*-\s+(.*)$", line)
        if m:
            s = _strip_comment(m.group(1)).strip()
            n = chk.check_spec("GPU spec '%s'" % s, s)
            if n:
                gpu.append(("GPU spec '%s'" % s, n))
    providers = {}
    for pkg, conf in (sp.get("packages") or {}).items():
        if pkg == "all":
            for virt, provs in ((conf or {}).get("providers") or {}).items():
                known = db.get("virtuals", {}).get(virt)
                if known is None:
                    chk.err("packages:all:providers:%s" % virt, "'%s' is not a known virtual package" % virt)
                    continue
                for pv in provs or []:
                    name = parse_spec(pv)[0]["name"] if isinstance(pv, str) else repr(pv)
                    if name not in known["providers"]:
                        chk.err("packages:all:providers:%s" % virt, "'%s' does not provide %s (known: %s)"
                                % (name, virt, ", ".join(sorted(known["providers"]))))
                providers[virt] = [parse_spec(pv)[0]["name"] for pv in provs or [] if isinstance(pv, str)]
        for key in ("require", "prefer", "conflict"):
            for s in (conf or {}).get(key, []) or []:
                if isinstance(s, dict) and "spec" not in s:
                    chk.err("packages:%s:%s" % (pkg, key), "%r is a YAML mapping: quote the spec" % (s,))
                    continue
                s = s if isinstance(s, str) else s.get("spec", "")
                if pkg == "all" or pkg == "mpi":
                    nodes = chk.check_spec("packages:%s:%s '%s'" % (pkg, key, s), s) if s[:1] not in "+~" else None
                else:
                    nodes = chk.check_spec("packages:%s:%s '%s'" % (pkg, key, s),
                                           s if s.startswith(pkg) else pkg + " " + s)
                if nodes and pkg == "mpi" and key == "require" and \
                        nodes[0]["name"] in db.get("virtuals", {}).get("mpi", {}).get("providers", {}):
                    chk.err("packages:mpi:require '%s'" % s, "requiring one MPI implementation makes a site MPI "
                            "(cray-mpich, openmpi external) fail to concretize: prefer it with "
                            "packages:all:providers:mpi: [%s] instead" % nodes[0]["name"])
                if nodes and key == "require" and nodes[0]["name"] == "mpich":
                    roots.append(("packages:%s:require '%s'" % (pkg, s), nodes))
        if pkg not in ("all", "mpi") and pkg not in db["packages"]:
            chk.err("packages:%s" % pkg, "not a known Spack package")
    mpi_providers = db.get("virtuals", {}).get("mpi", {}).get("providers", {})
    for s in specs:
        try:
            name = parse_spec(s)[0]["name"]
        except ValueError:
            continue
        if name in mpi_providers:
            chk.err("spec '%s'" % s, "a root spec on one MPI implementation (%s) forces it on every site: "
                    "name the virtual 'mpi' and make %s the default with packages:all:providers:mpi"
                    % (name, name))
    if (providers.get("mpi") or [None])[0] != "mpich":
        chk.err(path, "packages:all:providers:mpi: [mpich, ...] expected (mpich as the default MPI provider)")
    elif not any(n["name"] == "mpich" and n["versions"] for _, ns in roots for n in ns):
        chk.err(path, "mpich is the default MPI: require mpich@4.1: (hdf5+mpi conflicts with mpich@4.0:4.0.3), "
                "e.g. packages:mpich:require: [\"@4.1:\"]")
    rules(chk, roots, gpu)
    if sp.get("concretizer", {}).get("unify") is not True:
        chk.err(path, "concretizer: unify: true expected (one hdf5/mpi for wlb4d and py-h5py)")
    for inc in sp.get("include") or []:
        p = inc.get("path") if isinstance(inc, dict) else inc
        if not p:
            chk.err(path, "include entry without a path")
    print("%s: %d root specs, %d GPU alternatives checked against %s"
          % (path, len(roots), len(gpu), os.path.relpath(dbpath)))
    for e in chk.errors:
        print("ERROR " + e)
    if expect:
        missing = [x for x in expect if not any(re.search(x, e) for e in chk.errors)]
        for x in missing:
            print("self-test: no error matching %r" % x)
        return 1 if missing else 0
    return 1 if chk.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
