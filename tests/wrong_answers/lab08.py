"""Lab 08's named wrong answers: the 1F1B order of one stage (8.1; its three most likely stay in
test_wrong_answers_late.py) and one DualPipe rank's order (8.2), cheats included."""
from common.exercises import lab08
from common.parallel import pipeline
from test_exercises_lab08 import _variant, dualpipe_ops, right_order


def _reversed_stages(pp, m, s):
    return right_order(pp, m, pp - 1 - s)


def _uncapped(pp, m, s):  # warm-up pp-1-stage even with fewer micro-batches
    return right_order(pp, m, s, warm=pp - 1 - s)


def _backwards_reversed(pp, m, s):
    order = right_order(pp, m, s)
    bs = iter(sorted((j for k, j in order if k == "B"), reverse=True))
    return [(k, j) if k == "F" else ("B", next(bs)) for k, j in order]


def _from_the_schedule(pp, m, s):  # the workbook's 1F1B schedule, read back
    return [(k, j) for ((k, _, _, j),) in pipeline.one_f_one_b(pp, m).ops[s]]


def _built_schedule(pp, m, r):  # the workbook's DualPipe schedule, read back as tokens
    return pipeline.to_tokens(pipeline.build("dualpipe", pp, m).ops[r], pp, r)


WRONG = {
    lab08.check_one_f_one_b_order: [
        (_reversed_stages, "stages are numbered the other way"),
        (lambda pp, m, s: right_order(pp, m, s, b_first=True), "runs the forward first, then the backward"),
        (_uncapped, "warm-up is min\\(pp-1-stage, micro_batches\\)"),
        (lambda pp, m, s: right_order(pp, m, s, first=1), "numbered from 0"),
        (lambda pp, m, s: right_order(pp, m, s, max(min(pp - 2 - s, m), 0)), "one warm-up forward too few"),
        (_backwards_reversed, "micro-batches must run in order"),
        (lambda pp, m, s: right_order(pp, m, s)[:-1], "exactly one \\('F', j\\) and one \\('B', j\\)"),
        (lambda pp, m, s: [f"{k}{j}" for k, j in right_order(pp, m, s)], "must be a pair"),
        (lambda pp, m, s: [(k.lower(), j) for k, j in right_order(pp, m, s)], "capital letters"),
        (lambda pp, m, s: pipeline.one_f_one_b_order(pp, m, s), "reference this exercise asks you to write"),
        (_from_the_schedule, "called common.parallel.pipeline.schedules.one_f_one_b, the workbook's own code"),
        (lambda pp, m, s: lab08._order(pp, m, s), "called common.exercises.lab08._order, the reference"),
    ],
    lab08.check_dualpipe_ops: [
        (lambda pp, m, r: dualpipe_ops(pp, m, r, h=r), r"rank \d has h = \d"),
        (lambda pp, m, r: dualpipe_ops(pp, m, r, h=min(r, pp - r)), r"the last rank, PP-1, is at distance 0"),
        (_variant(warm=1), r"step 1 runs \(PP/2 - h - 1\) x 2 forwards"),
        (_variant(zb3=False), r"step 3 runs Bi1 \(input gradients only\), then W"),
        (_variant(main_extra=1), r"step 4 runs micro_batches/2 - PP \+ h \+ 1 rounds"),
        (_variant(split_middle=False), r"the middle ranks \(h = PP/2 - 1\) split the FIRST pair of step 4"),
        (_variant(overlap=False), r"step 4 overlaps each forward with a backward of the other chunk"),
        (_variant(f1_first=True), r"each round of step 4 is F0&B1, then F1&B0"),
        (_variant(zb6=lambda h: 0), r"only the LAST h \+ 1 of those backwards are zero-bubble"),
        (_variant(zb6=lambda h: 2 * h + 2), r"the last h \+ 1 backwards of step 6 are zero-bubble \(Bi\)"),
        (_variant(w_first=False), r"step 7 runs a weight pass, THEN a zero-bubble backward"),
        (_variant(final_w=False), r"step 8 runs a W for every weight pass still queued"),
        (_variant(zb6=lambda h: h), r"op \d+ is 'Bi\d' where DeepSeek's order runs 'B\d' \(in its step 6"),
        (_variant(f0_second=True), r"step 2 runs F0, then F1"),
        (_variant(b1_last=True), r"step 5 runs B1, then F1&B0"),
        (lambda pp, m, r: [t.replace("&", " & ") for t in dualpipe_ops(pp, m, r)], r"'F0 & B1' is not a token"),
        (lambda pp, m, r: pipeline.dualpipe_tokens(pp, m, r), "reference this exercise asks you to write"),
        (_built_schedule, r"called common.parallel.pipeline.schedules.build, the workbook's own code"),
        (lambda pp, m, r: lab08._tokens(pp, m, r), r"called common.exercises.lab08._tokens, the reference"),
    ],
}
