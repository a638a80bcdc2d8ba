"""A JupyterHub for a class on one machine (`make hub`, INSTRUCTOR.md section 4): learners on a roster log in with
hub-made passwords; each gets a Jupyter server in a bubblewrap sandbox of their own, in their own copy of the labs,
with the shared venv and their share of the box (threads, memory, a GPU or MIG instance); idle servers are culled;
`make collect LAB=NN` copies a lab from every learner into the grader's layout and grades it.

Modules: roster (names, passwords), share (threads, memory, GPU devices), accounts (Unix users, the learners'
copies), server (a learner's sandbox), settings (checked before the start), collect, cli (`python -m common hub`),
plugins (the JupyterHub classes: the only module that imports jupyterhub, which `make hub` installs on demand).
Part of `common.core`: imports nothing outside it.
"""
