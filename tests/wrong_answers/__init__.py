"""The audit of named wrong answers, one module per lab (`labNN.py`), each with

    WRONG = {checker: [(wrong_answer, "words its verdict must use"), ...], ...}

A wrong answer is what a learner might plausibly write (a mistake, a look-alike formula, a cheat that calls the
workbook or a library that does the exercise); the words name that mistake in the learner's terms, so a verdict that
names a nearby mistake fails the audit. tests/test_wrong_answers_audit.py runs every entry (plus the tables of
tests/test_wrong_answers.py and test_wrong_answers_late.py) and holds every checker whose solution has more than one
line to at least ten named wrong answers.
"""
