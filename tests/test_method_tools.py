"""Methods of AutoModule subclasses look like methods to tools:
doctest, `inspect`, `help`/pydoc, and autodoc tools (which read `__doc__`,
`__signature__`, `__wrapped__`, `__qualname__`, `__module__`, `inspect.isroutine`)."""

import doctest
import importlib
import inspect
import io
import pickle
import pydoc
import sys
import textwrap

import pytest

from autostatic.core._bound_method import BoundMethod

BASE_CODE = '''
    """An eqx.Module base in another file."""

    import equinox as eqx


    class Base(eqx.Module):
        def describe(self) -> str:
            """What this is.

            >>> "a model"
            'a model'
            """
            return "a model"
'''

USER_CODE = '''
    """A user's model file."""

    import equinox as eqx

    import autostatic as asx
    from user_base_docs import Base


    class Model(asx.AutoModule, Base):
        """A model."""

        scale: float

        def forward(self, x: float, *, bias: float = 0.0) -> float:
            """Scales x, then adds bias.

            >>> Model(2.0).forward(3.0, bias=1.0)
            7.0
            """
            return self.scale * x + bias

        @eqx.filter_jit
        def jitted(self, x):
            """Jitted.

            >>> float(Model(2.0).jitted(1.0))
            2.0
            """
            return self.scale * x

        def wrong(self):
            """A failing example, so that a test that runs nothing cannot pass.

            >>> Model(2.0).wrong()
            3
            """
            return 2
'''


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "user_base_docs.py").write_text(textwrap.dedent(BASE_CODE))
    (folder / "user_model_docs.py").write_text(textwrap.dedent(USER_CODE))
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("user_model_docs")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("user_model_docs", None)
        sys.modules.pop("user_base_docs", None)


def test_doctest_finds_and_runs_method_examples(user):
    tests = {t.name: t for t in doctest.DocTestFinder().find(user)}
    for name in ("forward", "jitted", "wrong"):
        assert tests[f"user_model_docs.Model.{name}"].examples
    assert tests["user_model_docs.Model.forward"].docstring.startswith("Scales x")
    runner = doctest.DocTestRunner(verbose=False)
    out = io.StringIO()
    for name in ("forward", "jitted"):
        result = runner.run(tests[f"user_model_docs.Model.{name}"], out=out.write)
        assert result == (0, 1), out.getvalue()
    result = runner.run(tests["user_model_docs.Model.wrong"], out=out.write)
    assert result.failed == 1


def test_doctest_finds_an_inherited_method_in_its_own_module_only(user):
    # The eqx.Module base's method is bound by a descriptor in Model's __dict__ too;
    # it says the function's module, so doctest does not run it twice.
    base = sys.modules["user_base_docs"]
    assert "user_model_docs.Model.describe" not in {
        t.name for t in doctest.DocTestFinder().find(user)
    }
    assert "user_base_docs.Base.describe" in {
        t.name for t in doctest.DocTestFinder().find(base)
    }
    assert vars(user.Model)["describe"].__module__ == "user_base_docs"


def test_signatures_without_self_on_the_bound_method(user):
    model = user.Model(2.0)
    on_class = "(self, x: float, *, bias: float = 0.0) -> float"
    bound = "(x: float, *, bias: float = 0.0) -> float"
    assert str(inspect.signature(user.Model.forward)) == on_class
    assert str(inspect.signature(model.forward)) == bound
    assert str(inspect.signature(inspect.unwrap(vars(user.Model)["forward"]))) == (
        on_class
    )
    assert str(inspect.signature(model.jitted)) == "(x)"
    assert str(inspect.signature(model.describe)) == "() -> str"


def test_names_docs_and_modules(user):
    model = user.Model(2.0)
    descriptor = vars(user.Model)["forward"]
    for method in (user.Model.forward, model.forward, descriptor):
        assert inspect.isroutine(method)
        assert method.__name__ == "forward"
        assert method.__qualname__ == "Model.forward"
        assert method.__module__ == "user_model_docs"
        assert inspect.getmodule(method) is user
        assert inspect.getdoc(method).startswith("Scales x, then adds bias.")
    assert inspect.unwrap(descriptor) is user.Model.forward
    assert inspect.getdoc(model.jitted).startswith("Jitted.")
    assert inspect.getdoc(model.describe).startswith("What this is.")
    assert model.forward.__wrapped__.__self__ is model
    # The class itself keeps its own name, module and documentation.
    assert BoundMethod.__module__ == "autostatic.core._bound_method"
    assert BoundMethod.__doc__.startswith("`module.method`")
    assert "BoundMethod" in repr(BoundMethod)


def test_help_and_pydoc_show_name_signature_and_doc(user):
    model = user.Model(2.0)
    text = pydoc.render_doc(model.forward, renderer=pydoc.plaintext)
    assert "forward(x: float, *, bias: float = 0.0) -> float" in text
    assert "Scales x, then adds bias." in text
    assert "user_model_docs" in text
    assert "BoundMethod" not in text.split("\n", 2)[2]  # not the class's help
    output = io.StringIO()
    pydoc.Helper(output=output).help(user.Model)
    text = output.getvalue()
    assert "forward(self, x: float, *, bias: float = 0.0) -> float" in text
    assert "Scales x, then adds bias." in text
    assert "describe(self) -> str" in text
    output = io.StringIO()
    pydoc.Helper(output=output).help(model.forward)
    assert "Scales x, then adds bias." in output.getvalue()


def test_tool_support_keeps_identity_hashing_and_pickling(user):
    model = user.Model(2.0)
    method = model.forward
    assert model.forward is method
    assert hash(model.forward) == hash(method)
    assert method.__get__(object()) is method  # a stored bound method stays bound
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(method, protocol=protocol)
        assert b"_ModuleOfFunction" not in data
        assert pickle.loads(data)(3.0) == 6.0


def test_a_bound_method_in_a_class_body_is_not_rebound(user):
    import autostatic as asx

    model = user.Model(2.0)

    class Holder(asx.AutoModule):
        forward = model.forward
        n: int = 0

    assert Holder().forward is model.forward
    assert Holder().forward(1.0) == 2.0
