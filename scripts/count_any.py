"""Count `Any` in lanefold's library code at a git revision (issue 39's figure).

`python scripts/count_any.py [REV]` prints two figures for the tree at REV (default HEAD):
every `Any` name in the AST of the library's modules (`orchestrator/`, `primitives/`,
`backends/`, `coordinators/`, `stores/`), and those inside the annotations of public functions'
signatures (a name without a leading underscore, or `__init__`). The engine's numba kernels are
left out (`_kernels.py` before 0.2, the modules it was split into after): numba's signatures
are `Any` by nature. Read from git, so any commit can be counted without checking it out.
"""

from __future__ import annotations

import ast
import subprocess
import sys

ROOTS = ("orchestrator/", "primitives/", "backends/", "coordinators/", "stores/")
KERNELS = (
    "_kernels.py",
    "_compiled.py",
    "_lane_step.py",
    "_layers.py",
    "_products.py",
    "_shared_attention.py",
    "_tiled_step.py",
    "_tiles.py",
)


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    )


def _signature_anys(tree: ast.AST) -> int:
    found = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name.startswith("_") and node.name != "__init__":
            continue
        args = node.args
        notes = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.annotation]
        notes += [a.annotation for a in (args.vararg, args.kwarg) if a is not None and a.annotation]
        if node.returns is not None:
            notes.append(node.returns)
        found += sum(1 for note in notes for part in ast.walk(note) if _is_any(part))
    return found


def main(rev: str = "HEAD") -> None:
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev], capture_output=True, text=True, check=True
    ).stdout.split()
    total = signatures = 0
    for path in listed:
        if not (path.endswith(".py") and path.startswith(ROOTS)) or path.endswith(KERNELS):
            continue
        source = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True)
        tree = ast.parse(source.stdout)
        total += sum(1 for node in ast.walk(tree) if _is_any(node))
        signatures += _signature_anys(tree)
    print(f"{rev}: Any in library code {total}, in public functions' signatures {signatures}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
