"""What lab 14's build exercises are judged on: the scenarios each checker runs and the wrong answers it names.

- `scheduler_cases` (14.6): fixed and random states, a trace, the named wrong scheduling policies;
- `decode_cases` (14.7): paged decode cases and the named mistakes of the decode loop;
- `prefix_cases` (14.8): request sequences and the named wrong prefix-cache policies.
"""
from common.exercises.lab14_cases.decode_cases import (DECODE_ARGS, DECODE_MISTAKES, decode_case, decode_cases,
                                                       decode_variant, name_decode_mistake)
from common.exercises.lab14_cases.prefix_cases import (PREFIX_MISTAKES, PrefixCachePolicy, describe_op, describe_seen,
                                                       mistake_trajectory, prefix_scripts, prefix_trajectory)
from common.exercises.lab14_cases.scheduler_cases import (SCHEDULER_MISTAKES, Scheduler, describe_result,
                                                          describe_state, name_scheduler_mistake,
                                                          random_scheduler_state, scheduler_invariants,
                                                          scheduler_scenarios, scheduler_states, seqs, step_result)
