"""The labs generator: stubs, cleared outputs, learner edits never overwritten."""
import nbformat
import pytest

from common.core import notebooks


def _solution(tmp_path, code, md="Answer: <!-- BEGIN SOLUTION -->42<!-- END SOLUTION -->"):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Lab 98 -- test"), nbformat.v4.new_code_cell(code),
                nbformat.v4.new_markdown_cell(md)]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hello")]
    nb.cells[1].execution_count = 3
    sol, labs = tmp_path / "solutions", tmp_path / "labs"
    sol.mkdir()
    nbformat.write(nb, str(sol / "98_test.ipynb"))
    return sol, labs


CODE = """# Exercise 98.1: add
def add(a, b):
    ### BEGIN SOLUTION
    return a + b
    ### END SOLUTION
"""


def test_stub_and_clear(tmp_path):
    sol, labs = _solution(tmp_path, CODE)
    notebooks.generate(solutions=sol, labs=labs)
    lab = nbformat.read(str(labs / "98_test.ipynb"), as_version=4)
    code = [c for c in lab.cells if c.cell_type == "code"][0]
    assert 'raise NotImplementedError("Exercise 98.1: replace this line with your code")' in code.source
    assert "return a + b" not in code.source and code.source.count("    raise") == 1
    assert code.outputs == [] and code.execution_count is None
    assert lab.cells[-1].source == "Answer: *Your answer here.*"
    assert "Learner copy" in lab.cells[1].source
    ns = {}
    exec(code.source, ns)
    with pytest.raises(NotImplementedError, match="Exercise 98.1"):
        ns["add"](1, 2)


def test_learner_edits_are_kept_or_backed_up(tmp_path):
    sol, labs = _solution(tmp_path, CODE)
    notebooks.generate(solutions=sol, labs=labs)
    path = labs / "98_test.ipynb"
    lab = nbformat.read(str(path), as_version=4)
    lab.cells[2].source = lab.cells[2].source.replace("raise NotImplementedError(", "return a - b  # (")
    nbformat.write(lab, str(path))
    edited = path.read_text()
    assert notebooks.edited_by_learner(path)
    lines = notebooks.generate(solutions=sol, labs=labs)
    assert "KEPT" in lines[0] and path.read_text() == edited
    lines = notebooks.generate(solutions=sol, labs=labs, force=True)
    backups = list((labs / ".backup").glob("98_test.*.ipynb"))
    assert len(backups) == 1 and backups[0].read_text() == edited
    assert "backed up" in lines[0] and not notebooks.edited_by_learner(path)


def test_executed_lab_without_edits_is_regenerated(tmp_path):
    sol, labs = _solution(tmp_path, CODE)
    notebooks.generate(solutions=sol, labs=labs)
    path = labs / "98_test.ipynb"
    lab = nbformat.read(str(path), as_version=4)
    lab.cells[2].outputs = [nbformat.v4.new_output("stream", text="ran")]
    nbformat.write(lab, str(path))
    assert not notebooks.edited_by_learner(path)
    assert notebooks.generate(solutions=sol, labs=labs)[0].endswith("written")


@pytest.mark.parametrize("code,match", [("### BEGIN SOLUTION\nx = 1\n", "never closed"),
                                        ("x = 1\n### END SOLUTION\n", "without a"),
                                        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n", "inside another")])
def test_unpaired_markers(tmp_path, code, match):
    sol, labs = _solution(tmp_path, code)
    with pytest.raises(notebooks.MarkerError, match=match):
        notebooks.generate(solutions=sol, labs=labs)


def test_out_of_sync_detects_stale_lab(tmp_path):
    sol, labs = _solution(tmp_path, CODE)
    notebooks.generate(solutions=sol, labs=labs)
    assert notebooks.out_of_sync(sol, labs) == []
    nb = nbformat.read(str(sol / "98_test.ipynb"), as_version=4)
    nb.cells[0].source += "\nmore"
    nbformat.write(nb, str(sol / "98_test.ipynb"))
    assert notebooks.out_of_sync(sol, labs) == ["98_test.ipynb"]


def test_language_info_is_what_ipykernel_reports():
    """JupyterLab marks a notebook unsaved on opening when the kernel's language_info differs from the file's."""
    from ipykernel.ipkernel import IPythonKernel

    from common.core import notebooks
    reported = dict(IPythonKernel.language_info)
    reported["version"] = __import__("platform").python_version()
    assert notebooks.language_info() == reported
