"""An agentrt plugin in one package: the game Nim, a perfect scripted Nim player, and a
single-policy task with its reward. Importing it registers each under a name a YAML config uses:

- env ``Nim-v0`` (:class:`nim_plugin.env.Nim`, zero-sum, so leagues default to RAE advantages);
- scripted policy ``optimal-nim`` (:class:`nim_plugin.players.OptimalNim`), also reachable
  without registering as ``kind: nim_plugin.players:OptimalNim``;
- task ``nim-move`` and reward ``nim_optimal`` (:mod:`nim_plugin.task`) for ``agentrt train``;
- match format ``gauntlet`` (:mod:`nim_plugin.schedule`), also reachable without registering as
  ``format: nim_plugin.schedule:gauntlet``.

Load it with ``imports: [nim_plugin]`` in a config (the config's folder is searched), with
``--import nim_plugin``, or install this folder (``pip install examples/plugin_pkg``): its
``agentrt.core.plugins`` entry point then loads it for every command.
"""

from nim_plugin import env, players, schedule, task  # importing registers them

__all__ = ["env", "players", "schedule", "task"]
