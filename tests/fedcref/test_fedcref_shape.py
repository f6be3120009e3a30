"""The shape of FedCRef's code: its variants are objects chosen once (fedclust/fedcref/rules.py),
so no function of the package takes more than 6 parameters, and the server loop
(``algorithm.run``) stays short enough to read as the paper's Algorithm 1."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fedclust" / "fedcref"
MAX_PARAMETERS = 6
MAX_RUN_LINES = 80


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter but a leading ``self``/``cls``: positional-only, positional,
    keyword-only, and ``*args``/``**kwargs`` one each."""
    a = fn.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    n = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - 1 if positional and positional[0] in ("self", "cls") else n


def _estimator_init(fn: ast.AST, parent: ast.AST | None) -> bool:
    """A scikit-learn estimator's ``__init__``: its API asks for one keyword per
    hyperparameter (``get_params`` reads the signature)."""
    return (isinstance(parent, ast.ClassDef) and getattr(fn, "name", "") == "__init__"
            and any(getattr(b, "id", getattr(b, "attr", "")) == "BaseEstimator"
                    for b in parent.bases))


def too_many_parameters(source: str, limit: int = MAX_PARAMETERS) -> list[tuple[str, int]]:
    """``(qualified name, count)`` of every function of ``source`` with more than ``limit``
    parameters (scikit-learn estimators' ``__init__`` excepted)."""
    out = []

    def visit(node: ast.AST, prefix: str, parent: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = parameter_count(child)
                if n > limit and not _estimator_init(child, node):
                    out.append((prefix + child.name, n))
                visit(child, prefix + child.name + ".", child)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", child)
            else:
                visit(child, prefix, parent)

    visit(ast.parse(source), "", None)
    return out


def function_lines(source: str, name: str) -> int:
    """Lines of the module-level function ``name`` (signature and docstring included)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise LookupError(name)


def test_no_fedcref_function_takes_more_than_six_parameters() -> None:
    offenders = {f"{path.name}:{name}": n for path in sorted(PACKAGE.glob("*.py"))
                 for name, n in too_many_parameters(path.read_text())}
    assert not offenders, (f"functions of fedclust/fedcref with more than {MAX_PARAMETERS} "
                           f"parameters (bundle them in a frozen dataclass, or make the "
                           f"variant an object of fedclust/fedcref/rules.py): {offenders}")


def test_the_server_loop_reads_in_one_screen() -> None:
    lines = function_lines((PACKAGE / "algorithm.py").read_text(), "run")
    assert lines <= MAX_RUN_LINES, f"algorithm.run has {lines} lines (at most {MAX_RUN_LINES})"


def test_the_checker_counts_every_kind_of_parameter() -> None:
    src = '''
def seven(a, b, /, c, *args, d, e=1, **kw): ...
def six(a, b, c, d, e, f): ...
class C:
    def method(self, a, b, c, d, e, f, g): ...
    @classmethod
    def build(cls, a, b, c, d, e, f): ...
    def outer(self):
        def inner(a, b, c, d, e, f, g): ...
class Estimator(BaseEstimator):
    def __init__(self, a, b, c, d, e, f, g): ...
    def fit(self, a, b, c, d, e, f, g): ...
'''
    assert too_many_parameters(src) == [("seven", 7), ("C.method", 7), ("C.outer.inner", 7),
                                        ("Estimator.fit", 7)]
    assert function_lines("x = 1\n\ndef run():\n    a = 1\n    return a\n", "run") == 3
