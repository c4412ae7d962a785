#!/usr/bin/env python3
"""Check the Spack recipe spack/packages/wlb4d/package.py without Spack
(ctest spack_recipe, label unit; stdlib only).

  tests/spack/check_spack_recipe.py [package.py] [--spack-yaml spack.yaml] [--cmake-root DIR]
  tests/spack/check_spack_recipe.py tests/spack/bad-package.py --expect REGEX ...   (self-test)

The recipe is read with Python's ast, never imported (Spack is not installed):
* imports: build-system classes only from the modules listed in
  tests/spack/spack_packages.json ("build_systems"), and the class derives
  from them; only known Spack directives are called in the class body;
* every depends_on/conflicts/requires spec (also inside `with when(...)` and
  the `for arch in CudaPackage.cuda_arch_values` forwarding loop, expanded
  for every cuda_arch of the JSON file) names a known package or virtual and
  only its real variants and values (check_spack_yaml's Checker); every
  `when=` names only the recipe's own variants (its variant() calls plus those
  of its base classes);
* the constraints agree with spack.yaml: same version range for every package
  both name, the spack.yaml variants present in the recipe (the CPU specs as
  the recipe's `+openmp` build, the "# GPU:" lines as `+cuda cuda_arch=90`),
  and check_spack_yaml's recipe rules (kokkos+cuda needs +wrapper, kokkos-kernels
  pins kokkos, nccl needs cuda_arch, hdf5 +mpi, ...) hold for both builds;
* MPI is the virtual `mpi` (no concrete provider);
* cmake_args only define CMake variables that the project's CMake reads:
  option()s of the CMakeLists.txt files, variables read in cmake/*.cmake,
  or CMAKE_* variables; define_from_variant names a declared variant.
Exit status 0 when everything holds; otherwise one line per problem and 1.
"""
import ast
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_spack_yaml as sy  # noqa: E402  (same folder; parse_yaml, parse_spec, Checker, rules)

TOP = os.path.normpath(os.path.join(HERE, "..", ".."))


def _str(node, env):
    """Value of a string literal or f-string (names substituted from env), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in env:
                out.append(env[v.value.id])
            else:
                return None
        return "".join(out)
    return None


def _kw(call, name):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _and(a, b):
    return " ".join(x for x in (a, b) if x)


class Recipe:
    """What the class body of a recipe declares: variants, dependencies, conflicts, cmake args."""

    def __init__(self, path, db, chk):
        self.path, self.db, self.chk = path, db, chk
        self.tree = ast.parse(open(path).read(), filename=path)
        self.variants = {}     # name -> {"values": "bool" | [..], "when": str}
        self.deps = []         # (spec, when, types, lineno)
        self.conflicts = []    # (spec, when, lineno)
        self.defines = []      # (cmake var, variant or None, lineno)
        self.base_vars = {}
        self.cls = None

    def err(self, lineno, msg):
        self.chk.err("%s:%d" % (os.path.relpath(self.path, TOP), lineno), msg)

    def parse(self):
        imported = {}
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spack_repo."):
                known = self.db["build_systems"].get(node.module)
                for a in node.names:
                    if known is None or a.name not in known["classes"]:
                        self.err(node.lineno, "'from %s import %s': not a known Spack build system "
                                 "(tests/spack/spack_packages.json build_systems)" % (node.module, a.name))
                    else:
                        imported[a.asname or a.name] = known["classes"][a.name]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spack") \
                    and node.module != "spack.package":
                self.err(node.lineno, "'from %s import ...': a recipe imports only spack.package and "
                         "spack_repo.builtin.build_systems (Package API)" % node.module)
        classes = [n for n in self.tree.body if isinstance(n, ast.ClassDef)]
        if len(classes) != 1:
            self.err(1, "expected exactly one package class, found %d" % len(classes))
            return
        self.cls = cls = classes[0]
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        if "CMakePackage" not in bases:
            self.err(cls.lineno, "the recipe must be a CMakePackage (wlb4d builds with CMake)")
        for b in bases:
            if b not in imported:
                self.err(cls.lineno, "base class %s is not imported from a known build system" % b)
            else:
                self.base_vars.update(imported[b].get("variants", {}))
        self.bases = bases
        self._body(cls.body, "", {})
        for f in cls.body:
            if isinstance(f, ast.FunctionDef) and f.name == "cmake_args":
                for n in ast.walk(f):
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                            n.func.attr in ("define", "define_from_variant") and n.args:
                        var = _str(n.args[0], {})
                        v = _str(n.args[1], {}) if n.func.attr == "define_from_variant" and len(n.args) > 1 \
                            else (var.lower() if n.func.attr == "define_from_variant" and var else None)
                        self.defines.append((var, v, n.lineno))

    def _body(self, stmts, when, env):
        for st in stmts:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                self._directive(st.value, when, env)
            elif isinstance(st, ast.With):
                w = when
                for item in st.items:
                    c = item.context_expr
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "when":
                        w = _and(w, _str(c.args[0], env) if c.args else "")
                    else:
                        self.err(st.lineno, "unexpected 'with' in the class body")
                self._body(st.body, w, env)
            elif isinstance(st, ast.For):
                it = st.iter
                if isinstance(it, ast.Attribute) and it.attr == "cuda_arch_values" and isinstance(st.target, ast.Name):
                    for arch in self.db["cuda_arch_values"]:
                        self._body(st.body, when, dict(env, **{st.target.id: arch}))
                else:
                    self.err(st.lineno, "a for loop in the class body may only run over CudaPackage.cuda_arch_values")

    def _directive(self, call, when, env):
        name = call.func.id if isinstance(call.func, ast.Name) else None
        if name not in self.db["directives"]:
            self.err(call.lineno, "'%s' is not a Spack directive the recipe may call (%s)"
                     % (ast.unparse(call.func) if hasattr(ast, "unparse") else name, ", ".join(self.db["directives"])))
            return
        w = _and(when, _str(_kw(call, "when"), env) if _kw(call, "when") is not None else "")
        if name == "variant":
            vname = _str(call.args[0], env)
            default = _kw(call, "default")
            values = _kw(call, "values")
            if values is None:
                vals = "bool" if isinstance(getattr(default, "value", None), bool) else None
            else:
                try:
                    vals = [str(x) for x in ast.literal_eval(values)]
                except ValueError:
                    vals = None
            if _kw(call, "description") is None:
                self.err(call.lineno, "variant '%s' has no description" % vname)
            self.variants[vname] = {"values": vals, "when": w}
        elif name == "depends_on":
            spec = _str(call.args[0], env) if call.args else None
            if spec is None:
                self.err(call.lineno, "depends_on needs a literal spec")
                return
            t = _kw(call, "type")
            types = ast.literal_eval(t) if t is not None else ("build", "link")
            self.deps.append((spec, w, (types,) if isinstance(types, str) else tuple(types), call.lineno))
        elif name in ("conflicts", "requires"):
            spec = _str(call.args[0], env) if call.args else None
            self.conflicts.append((spec, w, call.lineno))

    # ---- checks ----------------------------------------------------------------------------
    def own_variants(self):
        v = dict(self.base_vars)
        for k, x in self.variants.items():
            v[k] = x["values"]
        return v

    def check_condition(self, text, lineno, what):
        """A when= or conflicts spec about the recipe itself: only its own variants."""
        if not text:
            return
        if "^" in text:  # a dependency condition: check that part as a spec
            head, _, rest = text.partition("^")
            self.check_condition(head.strip(), lineno, what)
            self.chk.check_spec("%s:%d %s '%s'" % (os.path.relpath(self.path, TOP), lineno, what, text), rest)
            return
        try:
            nodes = sy.parse_spec("wlb4d " + text)
        except ValueError as e:
            self.err(lineno, "%s '%s': %s" % (what, text, e))
            return
        own = self.own_variants()
        for var, val in nodes[0]["variants"].items():
            if var not in own:
                self.err(lineno, "%s '%s': the recipe has no variant '%s' (declared: %s)"
                         % (what, text, var, " ".join(sorted(own))))
                continue
            spec = own[var]
            if isinstance(spec, dict):
                spec = spec["values"]
            allowed = self.db["cuda_arch_values"] + ["none"] if spec == "cuda_arch" else spec
            if allowed == "bool" and not isinstance(val, bool):
                self.err(lineno, "%s '%s': variant '%s' is boolean" % (what, text, var))
            elif isinstance(allowed, list) and not isinstance(val, bool):
                for x in val:
                    if x not in allowed:
                        self.err(lineno, "%s '%s': %s=%s is not one of %s" % (what, text, var, x, ",".join(allowed)))

    def check_names(self):
        for spec, when, types, lineno in self.deps:
            where = "%s:%d depends_on('%s')" % (os.path.relpath(self.path, TOP), lineno, spec)
            self.chk.check_spec(where, spec)
            self.check_condition(when, lineno, "when=")
            for t in types:
                if t not in ("build", "link", "run", "test"):
                    self.err(lineno, "depends_on('%s'): type '%s' is not build, link, run or test" % (spec, t))
        for spec, when, lineno in self.conflicts:
            self.check_condition(spec, lineno, "conflicts")
            self.check_condition(when, lineno, "when=")
        for vname, v in self.variants.items():
            if vname in self.db["packages"] or vname in self.db.get("virtuals", {}):
                pass  # a variant may share a package's name (+bench, +cuda); nothing to check
            if v["values"] is None:
                self.err(self.cls.lineno, "variant '%s': give default=True/False or a literal values=" % vname)
        mpi = self.db.get("virtuals", {}).get("mpi", {}).get("providers", {})
        if not any(sy.parse_spec(s)[0]["name"] == "mpi" for s, _, _, _ in self.deps):
            self.err(self.cls.lineno, "the recipe must depends_on('mpi') (the virtual)")
        for spec, when, types, lineno in self.deps:
            if sy.parse_spec(spec)[0]["name"] in mpi:
                self.err(lineno, "depends_on('%s'): one MPI implementation; depend on the virtual 'mpi' so a "
                         "site MPI (cray-mpich, openmpi) can provide it" % spec)

    def check_cmake(self):
        opts = set()
        for f in [os.path.join(TOP, "CMakeLists.txt")] + glob.glob(os.path.join(TOP, "*", "CMakeLists.txt")):
            opts |= set(re.findall(r"^\s*option\(\s*(\w+)", open(f).read(), re.M))
        read = set()
        for f in glob.glob(os.path.join(TOP, "cmake", "*.cmake")):
            read |= set(re.findall(r"\$\{(\w+)\}", open(f).read()))
        if not any(v == "WLB4D_ENABLE_CUDA" for v, _, _ in self.defines):
            self.err(self.cls.lineno, "cmake_args must map +cuda to -DWLB4D_ENABLE_CUDA")
        own = self.own_variants()
        for var, variant, lineno in self.defines:
            if var is None:
                self.err(lineno, "cmake_args: define() needs a literal CMake variable name")
                continue
            if not (var in opts or var in read or var.startswith("CMAKE_")):
                self.err(lineno, "cmake_args: -D%s is not read by the project's CMake (options: %s)"
                         % (var, " ".join(sorted(opts))))
            if variant is not None and variant not in own:
                self.err(lineno, "cmake_args: define_from_variant('%s', '%s'): no such variant" % (var, variant))

    def build(self, active):
        """The dependency nodes of one build: every depends_on whose when= holds for the
        set of active own-variant settings, merged per package (as the concretizer would)."""
        merged = {}
        for spec, when, types, lineno in self.deps:
            if when and not self._holds(when, active):
                continue
            node = sy.parse_spec(spec)[0]
            m = merged.setdefault(node["name"], {"name": node["name"], "versions": None, "variants": {},
                                                 "compiler": None, "lineno": lineno})
            if node["versions"]:
                if m["versions"] and m["versions"] != node["versions"]:
                    self.err(lineno, "%s: two version ranges (%s, %s)" % (node["name"], m["versions"], node["versions"]))
                m["versions"] = node["versions"]
            m["variants"].update(node["variants"])
        return merged

    @staticmethod
    def _holds(when, active):
        try:
            node = sy.parse_spec("wlb4d " + when)[0]
        except ValueError:
            return False
        for var, val in node["variants"].items():
            have = active.get(var, False)
            if isinstance(val, bool):
                if bool(have) != val:
                    return False
            elif have is False or have is True or sorted(val) != sorted(have):
                return False
        return True


def agree(chk, rec, yaml_path, rel):
    """spack.yaml and the recipe ask for the same things (versions, variants, recipe rules)."""
    text = open(yaml_path).read()
    doc = sy.parse_yaml(text)
    sp = doc["spack"]
    cpu = {}
    for s in sp.get("specs") or []:
        if isinstance(s, str):
            n = sy.parse_spec(s)[0]
            cpu[n["name"]] = n
    gpu = {}
    for line in text.splitlines():
        m = re.match(r"^\s*#\s*GPU:\s*-\s+(.*)$", line)
        if m:
            n = sy.parse_spec(sy._strip_comment(m.group(1)).strip())[0]
            gpu[n["name"]] = n
    arch = None
    for n in gpu.values():
        if "cuda_arch" in n["variants"]:
            arch = n["variants"]["cuda_arch"]
    # spack.yaml is the +openmp build with every optional part (bench, scripts) on.
    cpu_build = {"openmp": True, "bench": True, "scripts": True}
    builds = [("CPU (spack.yaml specs)", cpu, cpu_build),
              ("GPU (spack.yaml '# GPU:' lines)", dict(cpu, **gpu),
               dict(cpu_build, cuda=True, cuda_arch=arch or ["90"]))]
    for label, want, active in builds:
        have = rec.build(active)
        where_b = "%s as %s" % (rel, " ".join(("+%s" % k) if v is True else "%s=%s" % (k, ",".join(v))
                                               for k, v in active.items()))
        for name, n in want.items():
            if name not in have:
                if name == "openblas":
                    continue  # the BLAS provider is the site's choice (kokkos-kernels +blas needs one)
                chk.err(where_b, "spack.yaml's %s asks for '%s', the recipe does not depend on it" % (label, name))
                continue
            h = have[name]
            if n["versions"] and h["versions"] != n["versions"]:
                chk.err("%s:%d" % (rel, h["lineno"]), "%s@%s in the recipe, %s@%s in spack.yaml: keep them equal"
                        % (name, h["versions"], name, n["versions"]))
            for var, val in n["variants"].items():
                if var not in h["variants"]:
                    chk.err("%s:%d" % (rel, h["lineno"]), "%s: spack.yaml's %s says %s, the recipe's %s build does not"
                            % (name, label, ("+" if val is True else "~") + var if isinstance(val, bool)
                               else "%s=%s" % (var, ",".join(val)), where_b))
                elif h["variants"][var] != val:
                    chk.err("%s:%d" % (rel, h["lineno"]), "%s %s: %r in the recipe, %r in spack.yaml"
                            % (name, var, h["variants"][var], val))
        roots = [("%s: %s" % (where_b, nm), [dict(n)]) for nm, n in have.items()]
        # check_spack_yaml's recipe rules on this build of the recipe (hdf5 +mpi, kokkos +cuda
        # +wrapper +cuda_lambda, kokkos-kernels pins kokkos, nccl cuda_arch, ...)
        sub = sy.Checker(dict(chk.db, required_roots=[], required_gpu_roots=[]))
        sy.rules(sub, roots, roots if active.get("cuda") else [])
        chk.errors.extend(sub.errors)
        if active.get("cuda") and "nccl" not in have:
            chk.err(where_b, "+cuda needs nccl (the NCCL backend of wlb::comm, -DWLB4D_ENABLE_CUDA=ON)")


def main(argv):
    args = list(argv)
    expect = []
    while "--expect" in args:
        i = args.index("--expect")
        expect.append(args[i + 1])
        del args[i:i + 2]
    yaml_path = os.path.join(TOP, "spack.yaml")
    if "--spack-yaml" in args:
        i = args.index("--spack-yaml")
        yaml_path = args[i + 1]
        del args[i:i + 2]
    path = args[0] if args else os.path.join(TOP, "spack", "packages", "wlb4d", "package.py")
    db = json.load(open(os.path.join(HERE, "spack_packages.json")))
    chk = sy.Checker(db)
    try:
        rec = Recipe(path, db, chk)
    except SyntaxError as e:
        print("%s: Python: %s" % (path, e))
        return 1
    rec.parse()
    if rec.cls is not None:
        rec.check_names()
        rec.check_cmake()
        agree(chk, rec, yaml_path, os.path.relpath(path, TOP))
    # The repo folder around the real recipe: repo.yaml with a namespace, packages/<name>/.
    if not args:
        ry = os.path.join(TOP, "spack", "repo.yaml")
        if not os.path.isfile(ry):
            chk.err("spack/repo.yaml", "missing: `spack repo add spack` needs it")
        else:
            r = sy.parse_yaml(open(ry).read()).get("repo") or {}
            if not re.fullmatch(r"[A-Za-z]\w*", str(r.get("namespace", ""))):
                chk.err("spack/repo.yaml", "repo: namespace: <python identifier> expected")
            if r.get("api") not in (None, "v1.0"):
                chk.err("spack/repo.yaml", "api %s needs the spack_repo/<namespace>/ layout; this folder "
                        "is the v1.0 layout (repo.yaml + packages/)" % r.get("api"))
    print("%s: %d variants, %d dependencies, %d cmake defines checked against %s and %s"
          % (os.path.relpath(path, TOP), len(rec.variants), len(rec.deps), len(rec.defines),
             os.path.relpath(yaml_path, TOP), "tests/spack/spack_packages.json"))
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
