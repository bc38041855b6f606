"""agentrt.envs: Gymnasium-style text environments, turn-based games and adapters.

``make(id, **kwargs)`` builds any registered env; ``register(id, entry_point, multi_agent=...)``
adds one (see docs/envs.md for a new env in one small file).
"""

from __future__ import annotations

from agentrt.envs.bargain import Bargain
from agentrt.envs.board import ConnectFour, TicTacToe
from agentrt.envs.checker import check_multiagent_env
from agentrt.envs.games import ConnectThree, Hexapawn, Notakto
from agentrt.envs.core import (
    CHARSET,
    MultiAgentEnv,
    SingleAgentGame,
    TextEnv,
    action_text,
    clean_text,
    text_space,
)
from agentrt.envs.kuhn import KuhnPoker
from agentrt.envs.registration import ENVS, EnvSpec, is_multi_agent, make, make_multi, register
from agentrt.envs.single import CalculatorEnv, RecallEnv, TaskEnv, calculate

register("TicTacToe-v0", TicTacToe, multi_agent=True)
register("ConnectFour-v0", ConnectFour, multi_agent=True)
register("Hexapawn-v0", Hexapawn, multi_agent=True)
register("ConnectThree-v0", ConnectThree, multi_agent=True)
register("Notakto-v0", Notakto, multi_agent=True)
register("KuhnPoker-v0", KuhnPoker, multi_agent=True)
register("KuhnPoker3-v0", KuhnPoker, multi_agent=True, players=3)
register("Bargain-v0", Bargain, multi_agent=True)
register("Task-v0", TaskEnv, multi_agent=False)
register("ToolUse-v0", CalculatorEnv, multi_agent=False)
register("Recall-v0", RecallEnv, multi_agent=False)
# The decomposer's envs live in agentrt.decomposer (a layer above envs), imported on make.
register("Decompose-v0", "agentrt.decomposer.env:ChainEnv", multi_agent=True)
register("WordChain-v0", "agentrt.decomposer.env:WholeTaskEnv", multi_agent=False,
         family="wordchain")
register("EventPlan-v0", "agentrt.decomposer.env:WholeTaskEnv", multi_agent=False,
         family="eventplan")
register("Shopping-v0", "agentrt.decomposer.env:WholeTaskEnv", multi_agent=False,
         family="shopping")
register("OpenSpiel-v0", "agentrt.envs.openspiel_env:OpenSpielEnv", multi_agent=True,
         extra="games")
register("TextArena-v0", "agentrt.envs.textarena_env:TextArenaEnv", multi_agent=True,
         extra="games")

__all__ = [
    "CHARSET", "ENVS", "Bargain", "CalculatorEnv", "ConnectFour", "ConnectThree", "Hexapawn", "EnvSpec", "KuhnPoker", "Notakto",
    "MultiAgentEnv", "RecallEnv", "SingleAgentGame", "TaskEnv", "TextEnv", "TicTacToe",
    "action_text", "calculate", "check_multiagent_env", "clean_text", "is_multi_agent", "make",
    "make_multi", "register", "text_space",
]
