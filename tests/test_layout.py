"""The repository's layout holds (scripts/layers.py, run by `make lint`), and each of its
rules fails on a deliberate violation: the real sources with one import or line changed."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from gpuwire.vendor import VENDORS
from scripts import layers

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def repo() -> layers.Repository:
    return layers.Repository.read(REPO)


def changed(repo: layers.Repository, path: str, text: str, replacing: str = "") -> list[str]:
    """The violations once `text` is added at the end of `path` (a module's last lines), or
    put in place of `replacing`."""
    source = repo.sources[path]
    assert replacing in source
    source = source.replace(replacing, text) if replacing else source + text
    return layers.violations(dataclasses.replace(repo, sources={**repo.sources, path: source}))


@pytest.mark.parametrize("package", layers.PRODUCT)
def test_a_test_imports_the_product_package(package: str) -> None:
    """tests/gpuwire/ and its siblings are `tests.gpuwire`, ...: packages of their own, so
    they never stand in for the product on sys.path."""
    module = importlib.import_module(package)
    assert Path(str(module.__file__)).parent == REPO / package


def test_the_repository_keeps_its_layers(repo: layers.Repository) -> None:
    assert layers.violations(repo) == []


@pytest.mark.parametrize(
    ("path", "text", "message"),
    [
        (
            "webhook/mutation.py",
            "\nfrom deviceplugin.agent import labels\n",
            "imports deviceplugin.agent.labels: a component never imports another (webhook and "
            "deviceplugin)",
        ),
        (  # a function's import, under TYPE_CHECKING: still a dependency
            "inventory/view.py",
            "\ndef f():\n    if TYPE_CHECKING:\n        from certs import pki\n",
            "imports certs.pki: a component never imports another (inventory and certs)",
        ),
        ("gpuwire/annotations.py", "\nimport yaml\n", "imports yaml: gpuwire/ imports only"),
        ("gpuwire/elfstub.py", "\nfrom webhook import fleet\n", "imports webhook.fleet: gpuwire/"),
        ("certs/cli.py", "\nfrom testbed import apiserver\n", "the product never imports testbed/"),
        ("kubeclient/__init__.py", "\nimport inventory\n", "a library never imports a component"),
        ("testbed/lab.py", "\nfrom tests import conftest\n", "testbed/ never imports tests/"),
    ],
)
def test_an_import_across_a_layer_fails(
    repo: layers.Repository, path: str, text: str, message: str
) -> None:
    (found,) = changed(repo, path, text)
    assert found.startswith(f"{path}:")
    assert message in found


def test_the_start_path_imports_exactly_what_it_declares(repo: layers.Repository) -> None:
    spec = "runtime_hook/start/spec.py"
    grown = changed(repo, spec, "\ndef f():\n    from gpuwire import holders\n")
    assert (
        "runtime_hook/start/__init__.py: the start path imports gpuwire.holders, not in MODULES"
        in grown
    )  # with the standard modules holders imports, not in STDLIB
    heavy = changed(repo, spec, "\ndef f():\n    import yaml\n")
    assert heavy == [
        f"{spec}:{repo.sources[spec].count(chr(10)) + 3}: imports yaml on the container-start "
        "path, which imports the standard library and gpuwire only"
    ]
    # what never runs (typing-only) is no start import
    assert changed(repo, spec, "\nif TYPE_CHECKING:\n    from gpuwire import holders\n") == []
    init = "runtime_hook/start/__init__.py"
    last = '    "runtime_hook.start.trust",\n'
    stale = changed(repo, init, last + '    "runtime_hook.setup.cli",\n', replacing=last)
    assert stale == [f"{init}: MODULES names runtime_hook.setup.cli, which no start imports"]


def test_the_start_path_imports_exactly_the_standard_library_it_declares(
    repo: layers.Repository,
) -> None:
    """The resident imports nothing once it has entered the host's namespaces: a standard
    module a start imports, even in a function, must be one it preloads."""
    grown = changed(repo, "runtime_hook/start/spec.py", "\ndef f():\n    import zlib\n")
    init = "runtime_hook/start/__init__.py"
    assert grown == [f"{init}: the start path imports zlib, not in STDLIB"]
    last = '    "tomllib",\n'
    stale = changed(repo, init, last + '    "uuid",\n', replacing=last)
    assert stale == [f"{init}: STDLIB names uuid, which no start imports"]


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("webhook/patch.py", "\nfrom webhook import mutation\n"),  # mutation imports patch
        # as webhook/fleet.py ↔ placement.py did: a typing-only import is still a cycle
        ("webhook/fleet.py", "\nif TYPE_CHECKING:\n    from webhook.placement import Placement\n"),
        # as deviceplugin/discovery.py ↔ its backends did: through a function's import
        ("deviceplugin/gpus/discovery.py", "\ndef f():\n    from deviceplugin.gpus import nvml\n"),
    ],
)
def test_an_import_cycle_fails(repo: layers.Repository, path: str, text: str) -> None:
    (found,) = changed(repo, path, text)
    assert ": import cycle: " in found


def test_a_value_type_is_written_one_way(repo: layers.Repository) -> None:
    named = changed(repo, "webhook/pod.py", "\nclass Pair(NamedTuple):\n    a: int\n")
    assert len(named) == 1
    assert "class Pair is a NamedTuple: off the start path a value type is a" in named[0]
    value = changed(repo, "gpuwire/holders.py", "\nclass Pair(Value):\n    pass\n")
    assert "class Pair is a Value: off the start path" in value[0]
    undeclared, heavy = changed(repo, "gpuwire/devices.py", "\nfrom dataclasses import dataclass\n")
    assert undeclared.endswith("the start path imports dataclasses, not in STDLIB")
    assert "imports dataclasses on the start path" in heavy


@pytest.mark.parametrize(
    ("path", "text", "named"),
    [
        # as deviceplugin/gpus/backend.py chose its discovery
        (
            "deviceplugin/gpus/backend.py",
            '\nif "amd" == X:\n    pass\n',
            "compares with vendor amd",
        ),
        (
            "deviceplugin/cli.py",
            '\nok = X.vendor in ("nvidia", "y")\n',
            "compares with vendor nvidia",
        ),
        ("gpuwire/nodegpus.py", "\nok = X != amd.VENDOR\n", "compares with vendor amd.VENDOR"),
        ("webhook/mutation.py", "\nok = NVIDIA in X\n", "compares with vendor NVIDIA"),
        ("webhook/fleet.py", "\nok = [v for v in X if v is not AMD]\n", "compares with vendor AMD"),
        # as deviceplugin/agent/labeler.py asked `node.amd is not None`
        ("deviceplugin/agent/labeler.py", "\nok = X.amd is not None\n", ".amd names a vendor"),
        ("webhook/claims.py", "\nok = 1 if X.nvidia else 2\n", ".nvidia names a vendor"),
    ],
)
def test_a_vendor_asked_outside_the_vendor_modules_fails(
    repo: layers.Repository, path: str, text: str, named: str
) -> None:
    (found,) = changed(repo, path, text)
    assert found.startswith(f"{path}:{repo.sources[path].count(chr(10)) + 2}: {named}: ")
    assert "only the vendor modules ask which vendor they have" in found


@pytest.mark.parametrize("path", layers.VENDOR_MODULES)
def test_a_vendor_module_may_ask_which_vendor_it_has(repo: layers.Repository, path: str) -> None:
    assert changed(repo, path, '\nok = X.amd or X.vendor == "nvidia" or X is AMD\n') == []


def test_the_vendor_names_are_gpuwires() -> None:
    assert tuple(v.name for v in VENDORS) == layers.VENDORS


def test_the_image_holds_every_product_package_and_nothing_else(
    repo: layers.Repository,
) -> None:
    """The file list the Containerfile's COPY lines give /src, where the image installs
    from: every tracked file of every product package, none of testbed/ or the tests."""
    image = layers.copied_files(repo.containerfile, repo.tracked)
    for package in layers.PRODUCT:
        files = [p for p in repo.tracked if p.startswith(f"{package}/")]
        assert files
        assert all(image.get(p) == p for p in files), package
    packages = {p.split("/")[0] for p in image.values() if "/" in p}
    assert packages == set(layers.PRODUCT)
    assert sorted(p for p in image.values() if "/" not in p) == [
        "README.md",
        "constraints.txt",
        "pyproject.toml",
    ]
    assert image["runtime_hook/setup/gpuwire-runtime.sh"]  # package data too


def lists(repo: layers.Repository, **changes: object) -> list[str]:
    fields = {
        "pyproject": repo.pyproject,
        "containerfile": repo.containerfile,
        "tracked": repo.tracked,
        "commands": repo.commands,
    }
    return layers.list_violations(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_component_list_and_its_copies_must_agree(repo: layers.Repository) -> None:
    no_inventory = repo.containerfile.replace("COPY inventory inventory\n", "")
    (found,) = lists(repo, containerfile=no_inventory)
    assert found.startswith("Containerfile: the image lacks inventory/")
    testbed = repo.containerfile.replace("COPY certs certs\n", "COPY certs certs\nCOPY testbed .\n")
    (found,) = lists(repo, containerfile=testbed)
    assert found.startswith("Containerfile: the image has testbed/")
    without = repo.pyproject.replace('"kubeclient*", ', "")
    (found,) = lists(repo, pyproject=without)
    assert found.startswith("pyproject.toml: packages include")
    (found,) = lists(repo, commands=[*repo.commands, "testbed.apiserver:main"])
    assert found == "gpuwire/cli.py: commands of ['testbed'], which are no component"
    (found,) = lists(repo, commands=[c for c in repo.commands if not c.startswith("certs.")])
    assert found == "gpuwire/cli.py: no command runs ['certs']"
    untested = [p for p in repo.tracked if not p.startswith("tests/kubeclient/")]
    (found,) = lists(repo, tracked=untested)
    assert found == "tests/: no directory for ['kubeclient']"
