"""``longroute demo``: an emulated multi-region fleet, the gateway and a bench in one command.

Modules: :mod:`longroute.demo.fleet` (start fleets of emulators behind a
gateway, shared with the end-to-end tests), :mod:`longroute.demo.run`
(the comparison) and :mod:`longroute.demo.cli` (the command). Process
management lives in :mod:`longroute.launcher`.
"""
