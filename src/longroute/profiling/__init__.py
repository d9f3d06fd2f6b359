"""``longroute profile``: measure a live OpenAI-compatible engine from outside and fit a
measured engine profile (:mod:`longroute.estimators.measured_engine`) that the
simulator, the emulator and ``ttca`` load as an endpoint's hardware."""
