"""The layers of docs/architecture.md, checked: `python -m scripts.layers` (in `make lint`).

It reads the import statements of every product and testbed module (function-level ones
and those under `if TYPE_CHECKING:` included: each is a dependency) and fails, naming the
file, the line and the rule, where

- `gpuwire/` imports anything but the standard library;
- a component imports another component, or anything of `testbed`, `tests`, `bench`,
  `scripts` (and a library, `kubeclient`, imports a component);
- `testbed/` imports `tests`, `bench` or `scripts`;
- the container-start path (everything `runtime_hook.start.shim` and `.hook` import, at
  any depth, that runs) is not exactly `runtime_hook.start.MODULES`, the standard library
  modules it imports (the codecs it names by a literal included) not exactly
  `runtime_hook.start.STDLIB`, or it reaches a package outside the standard library;
- modules of one package import each other in a cycle;
- a value type is not written the one way: `@dataclass(frozen=True)`, except in the modules
  a start imports, where `dataclasses` costs too much and `gpuwire.value.Value` stands in;
- a product module outside `VENDOR_MODULES` asks which vendor it has: compares with a
  vendor's name (`== "amd"`, `in ("nvidia", ...)`, `== amd.VENDOR`) or instance (`is NVIDIA`,
  `AMD in vendors`), or reads an attribute named for a vendor (`node.amd`, `self.nvidia`);
- the component list below and its copies disagree: pyproject's packages and mypy files,
  the files the Containerfile copies into the image, the `gpuwire` command table, and the
  test directories.

Pure functions of the sources and files handed in, so that tests can hand in violations.
"""

from __future__ import annotations

import ast
import encodings
import encodings.aliases
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CONTRACT = "gpuwire"
LIBRARIES = ("kubeclient",)
COMPONENTS = ("webhook", "runtime_hook", "deviceplugin", "certs", "inventory")
PRODUCT = (CONTRACT, *LIBRARIES, *COMPONENTS)
TESTBED = "testbed"
USERS = ("tests", "bench", "scripts")  # may import everything; nothing imports them
START = "runtime_hook.start"
VENDORS = ("nvidia", "amd")  # gpuwire.vendor.VENDORS' names
# Where a vendor is chosen (docs/architecture.md, "Vendors"): the interfaces, by the name a
# config or flag gives, and `gpuwire sim node --vendor`, which hands AMD's node to amdsim.
VENDOR_MODULES = (
    "gpuwire/vendor.py",
    "gpuwire/sim.py",
    "deviceplugin/vendors.py",
    "deviceplugin/dra/vendors.py",
    "webhook/vendors.py",
)
START_ROOTS = (f"{START}.shim", f"{START}.hook")
STDLIB = frozenset(sys.stdlib_module_names)
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the module named, as precisely as the sources tell
    line: int
    typing_only: bool  # under `if TYPE_CHECKING:`: never runs


def top(module: str) -> str:
    return module.partition(".")[0]


def module_name(path: PurePosixPath) -> tuple[str, bool]:
    """`a/b/c.py` → (`a.b.c`, False); `a/b/__init__.py` → (`a.b`, True)."""
    parts = path.with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _typing_block(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str, source: str, known: Iterable[str]) -> list[Import]:
    """Every import in `source` (module `name`), with `from a import b` naming `a.b` where
    that is a module of `known`."""
    modules = set(known)
    found: list[Import] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _typing_block(child):
                for part in child.body:
                    visit_one(part, True)
                for part in child.orelse:
                    visit_one(part, typing_only)
            else:
                visit_one(child, typing_only)

    def visit_one(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(name, a.name, node.lineno, typing_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                target = full if full in modules else node.module
                found.append(Import(name, target, node.lineno, typing_only))
        else:
            visit(node, typing_only)

    visit(ast.parse(source), False)
    return found


class Tree:
    """The modules checked: name → (source path, source text, whether it is a package)."""

    def __init__(self, files: Mapping[str, str]) -> None:
        self.paths: dict[str, str] = {}
        self.sources: dict[str, str] = {}
        self.packages: set[str] = set()
        for path, source in files.items():
            name, package = module_name(PurePosixPath(path))
            self.paths[name], self.sources[name] = path, source
            if package:
                self.packages.add(name)
        self.imports = {n: imports(n, s, self.sources) for n, s in self.sources.items()}

    def where(self, found: Import) -> str:
        return f"{self.paths[found.importer]}:{found.line}"


def layer_violations(tree: Tree) -> list[str]:
    out = []
    for name, found in tree.imports.items():
        own = top(name)
        for i in found:
            target = top(i.target)
            if own == CONTRACT and target not in STDLIB and target != CONTRACT:
                out.append(
                    f"{tree.where(i)}: imports {i.target}: gpuwire/ imports only the "
                    "standard library"
                )
            elif own in COMPONENTS and target in COMPONENTS and target != own:
                out.append(
                    f"{tree.where(i)}: imports {i.target}: a component never imports "
                    f"another ({own} and {target}); what both need goes into gpuwire/"
                )
            elif own in (*COMPONENTS, *LIBRARIES) and target in (TESTBED, *USERS):
                out.append(
                    f"{tree.where(i)}: imports {i.target}: the product never imports {target}/"
                )
            elif own in LIBRARIES and target in COMPONENTS:
                out.append(
                    f"{tree.where(i)}: imports {i.target}: a library never imports a component"
                )
            elif own == TESTBED and target in USERS:
                out.append(f"{tree.where(i)}: imports {i.target}: testbed/ never imports {target}/")
    return out


def declared_start_modules(tree: Tree, name: str = "MODULES") -> tuple[str, ...]:
    """`MODULES` (or `STDLIB`) of runtime_hook/start/__init__.py: a tuple of strings, read
    from the source."""
    for node in ast.parse(tree.sources[START]).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [name]:
            value = ast.literal_eval(node.value)
            if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                return value
    raise ValueError(f"{tree.paths[START]}: no {name} = (...) of module names")


def codecs_named(source: str) -> set[str]:
    """The modules of the codecs `source` names by a literal (`encoding="ascii"`,
    `.encode("latin-1")`): a codec's module is imported when it is first looked up."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        values = [k.value for k in node.keywords if k.arg == "encoding"]
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("encode", "decode"):
            values += node.args[:1]
        names |= {v.value for v in values if isinstance(v, ast.Constant) and type(v.value) is str}
    modules = set()
    for name in names:
        normal = encodings.normalize_encoding(name).lower()
        modules.add(f"encodings.{encodings.aliases.aliases.get(normal, normal)}")
    return modules


def start_violations(tree: Tree) -> list[str]:
    """What a start runs: the roots, what they import at any depth (not typing-only), and
    the packages those live in (their `__init__` runs too)."""
    reached: set[str] = set()
    standard: set[str] = set()  # the standard library modules they import
    todo = list(START_ROOTS)
    out = []
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
        for i in tree.imports.get(name, ()):
            if i.typing_only:
                continue
            if i.target in tree.sources:
                todo.append(i.target)
            elif top(i.target) in STDLIB:
                standard.add(i.target)
            else:
                out.append(
                    f"{tree.where(i)}: imports {i.target} on the container-start path, "
                    "which imports the standard library and gpuwire only"
                )
    declared = set(declared_start_modules(tree))
    modules = reached - tree.packages
    standard |= {codec for name in modules for codec in codecs_named(tree.sources[name])}
    where = tree.paths[START]
    undeclared, unreached = sorted(modules - declared), sorted(declared - modules)
    out += [f"{where}: the start path imports {m}, not in MODULES" for m in undeclared]
    out += [f"{where}: MODULES names {m}, which no start imports" for m in unreached]
    library = set(declared_start_modules(tree, "STDLIB"))
    undeclared, unreached = sorted(standard - library), sorted(library - standard)
    out += [f"{where}: the start path imports {m}, not in STDLIB" for m in undeclared]
    out += [f"{where}: STDLIB names {m}, which no start imports" for m in unreached]
    return out


def cycle_violations(tree: Tree) -> list[str]:
    """Strongly connected modules of one package (Tarjan's algorithm, iteratively)."""
    edges = {
        name: sorted({i.target for i in found if i.target in tree.sources and i.target != name})
        for name, found in tree.imports.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    # a package importing its own modules (`from pkg import mod` in pkg/__init__) is no cycle
    return [
        f"{tree.paths[c[0]]}: import cycle: {' ↔ '.join(c)}"
        for c in cycles
        if not any(all(m == p or m.startswith(p + ".") for m in c) for p in c if p in tree.packages)
    ]


def value_violations(tree: Tree) -> list[str]:
    """Off the start path a value type is a frozen dataclass, never a `Value` or a
    `NamedTuple`; on it, `dataclasses` is not imported at all."""
    start = set(declared_start_modules(tree))
    out = []
    for name, source in tree.sources.items():
        for node in ast.walk(ast.parse(source)):
            if name in start and isinstance(node, ast.ImportFrom | ast.Import):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                )
                if "dataclasses" in names:
                    out.append(
                        f"{tree.paths[name]}:{node.lineno}: imports dataclasses on the "
                        "start path: its value types are gpuwire.value.Value"
                    )
            if name not in start and isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                if bases & {"Value", "NamedTuple"}:
                    out.append(
                        f"{tree.paths[name]}:{node.lineno}: class {node.name} is a "
                        f"{' '.join(sorted(bases & {'Value', 'NamedTuple'}))}: off the "
                        "start path a value type is a @dataclass(frozen=True)"
                    )
    return out


def _names_vendor(node: ast.expr) -> str | None:
    """The vendor a comparison's operand names: a vendor's name as a literal (or one of a
    literal tuple, list or set), as its module's `VENDOR`, or its instance (`NVIDIA`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value.lower() in VENDORS else None
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return next((n for n in map(_names_vendor, node.elts) if n is not None), None)
    if isinstance(node, ast.Attribute) and node.attr == "VENDOR":
        module = node.value
        return (
            f"{module.id}.VENDOR" if isinstance(module, ast.Name) and module.id in VENDORS else None
        )
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name if name is not None and name.lower() in VENDORS and name.isupper() else None


_ASKS = (
    "only the vendor modules ask which vendor they have; call what differs through the "
    'vendor interface (docs/architecture.md, "Vendors")'
)


def vendor_violations(tree: Tree) -> list[str]:
    """Outside `VENDOR_MODULES`, nothing asks which vendor it has: what differs per vendor
    is called through the node's or the request's vendor object."""
    out = []
    for name, source in tree.sources.items():
        path = tree.paths[name]
        if top(name) not in PRODUCT or path in VENDOR_MODULES:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare):
                named = [n for n in map(_names_vendor, [node.left, *node.comparators]) if n]
                if named:
                    out.append(f"{path}:{node.lineno}: compares with vendor {named[0]}: {_ASKS}")
            elif isinstance(node, ast.Attribute) and node.attr in VENDORS:
                out.append(f"{path}:{node.lineno}: .{node.attr} names a vendor: {_ASKS}")
    return out


def copied_files(containerfile: str, tracked: Sequence[str]) -> dict[str, str]:
    """The repository files the Containerfile's build stage copies into its WORKDIR (where
    the package is installed from): path there → repository path."""
    workdir, out = PurePosixPath("/"), dict[str, str]()
    for line in containerfile.replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0] not in ("WORKDIR", "COPY", "FROM"):
            continue
        if words[0] == "FROM" and out:
            break  # the next stage: nothing from the repository is copied past the build
        if words[0] == "WORKDIR":
            workdir = workdir / words[1]
            continue
        if words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            *sources, dest = [w for w in words[1:] if not w.startswith("--")]
            into_dir = len(sources) > 1 or dest.endswith("/")
            for source in sources:
                for path in tracked:
                    if path == source:  # a file: to dest, or into it
                        placed = (
                            workdir / dest / PurePosixPath(path).name
                            if into_dir
                            else (workdir / dest)
                        )
                    elif path.startswith(source.rstrip("/") + "/"):  # a directory's contents
                        placed = workdir / dest / PurePosixPath(path).relative_to(source)
                    else:
                        continue
                    if placed.is_relative_to(workdir):
                        out[str(placed.relative_to(workdir))] = path
    return out


def list_violations(
    pyproject: str,
    containerfile: str,
    tracked: Sequence[str],
    commands: Iterable[str],
) -> list[str]:
    """The component list against its copies. `commands`: the command table's targets."""
    out = []
    project = tomllib.loads(pyproject)
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    if sorted(include) != sorted(f"{p}*" for p in PRODUCT):
        out.append(f"pyproject.toml: packages include {include}, the product is {list(PRODUCT)}")
    files = set(project["tool"]["mypy"]["files"])
    if missing := [p for p in (*PRODUCT, TESTBED, *USERS) if p not in files]:
        out.append(f"pyproject.toml: mypy files leave out {missing}")
    for script, target in project["project"]["scripts"].items():
        if top(target) not in PRODUCT:
            out.append(f"pyproject.toml: script {script} = {target!r} is not in the product")
    image = copied_files(containerfile, tracked)
    for package in PRODUCT:
        missing = [p for p in tracked if p.startswith(f"{package}/") and image.get(p) != p]
        if missing:
            out.append(
                f"Containerfile: the image lacks {package}/ ({len(missing)} files, "
                f"e.g. {missing[0]})"
            )
    if leaked := sorted(p for p in image.values() if p.split("/")[0] in (TESTBED, *USERS)):
        out.append(f"Containerfile: the image has {leaked[0]}: not a product file")
    owners = {top(t.partition(":")[0]) for t in commands}
    if strays := sorted(owners - {CONTRACT, *COMPONENTS}):
        out.append(f"gpuwire/cli.py: commands of {strays}, which are no component")
    if silent := [c for c in COMPONENTS if c not in owners]:
        out.append(f"gpuwire/cli.py: no command runs {silent}")
    have = {p.split("/")[1] for p in tracked if p.startswith("tests/") and p.count("/") == 2}
    if untested := [p for p in (*PRODUCT, TESTBED) if p not in have]:
        out.append(f"tests/: no directory for {untested}")
    return out


@dataclass
class Repository:
    """What the checks read: product and testbed sources by path, the files the image and
    pyproject are built from, the tracked files, and the command table's targets."""

    sources: dict[str, str]
    pyproject: str
    containerfile: str
    tracked: list[str]
    commands: list[str]

    @classmethod
    def read(cls, root: Path = REPO) -> Repository:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        tracked = [p for p in listed if (root / p).exists()]
        from gpuwire.cli import COMMANDS

        return cls(
            sources={
                p: (root / p).read_text()
                for p in tracked
                if p.endswith(".py") and top(p.replace("/", ".")) in (*PRODUCT, TESTBED)
            },
            pyproject=(root / "pyproject.toml").read_text(),
            containerfile=(root / "Containerfile").read_text(),
            tracked=tracked,
            commands=[target for _, target, _ in COMMANDS],
        )


def violations(repo: Repository) -> list[str]:
    tree = Tree(repo.sources)
    return [
        *layer_violations(tree),
        *start_violations(tree),
        *cycle_violations(tree),
        *value_violations(tree),
        *vendor_violations(tree),
        *list_violations(repo.pyproject, repo.containerfile, repo.tracked, repo.commands),
    ]


def main() -> int:
    found = violations(Repository.read())
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
