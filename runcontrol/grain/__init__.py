"""RunGrain: the serialised command handler of one run (load -> decide -> commit).

The grain is a virtual actor in the Orleans sense: its memory is a cache of the run's rows and
never the authority. Every command commits in one ``runcontrol_apply`` statement that writes the
rows, the outbox events, the journal entries and the command's answer together, guarded by the
run's ``version``. If another activation committed first the guard fails; the grain reloads
and decides again, once, before answering ``ConcurrencyConflict`` (``decision``). A host must
call one grain's commands one at a time. After each commit the grain publishes one notice
(``bus.Committed``) that the parts of the activation subscribe to.

Commands are the typed messages of ``runcontrol.commands``; ``HANDLERS`` (``bus``, filled by
``handlers``) maps each type to the grain's handler. Every handler is a coroutine on the
caller's event loop: loads, port reads and commits are awaited (``runcontrol.store.commit``),
and every commit joins the process's group commit, so the commands of many runs committing at
the same moment share one statement. A committed command's answer is stored with its effect;
a resend of its ``command_id`` within the window (``RunControl:Commands:AnswerRetentionHours``)
gets that answer, never a second effect (``memo``). Submission, duplicate submission and rerun
are ``submission``. Several commands of one run that arrive together (an exchange's, a
batch's) are decided in one turn and committed as one document (``turn``).
"""

from .bus import HANDLERS, Committed, Handler
from .env import GrainEnv, Observer, Plan
from .grain import RunGrain
from .handlers import UNSERIALISED  # importing it registers every handler and effect
from .turn import Outcome, outcome, together, turn

__all__ = [
    "HANDLERS",
    "UNSERIALISED",
    "Committed",
    "GrainEnv",
    "Handler",
    "Observer",
    "Outcome",
    "Plan",
    "RunGrain",
    "outcome",
    "together",
    "turn",
]
