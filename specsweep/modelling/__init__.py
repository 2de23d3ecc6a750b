"""Modelling: what speculative decoding would do, used by the simulated server, the plan, a calibration and the
configuration's checks alike.

- ``decoding``: how a server decodes (an algorithm of the registry and its parameters);
- ``acceptance``: what the target generates and what the drafter proposes, round by round;
- ``cost``: what one engine step costs on a GPU, model and runtime profile;
- ``profiles``: the shipped GPU, model, runtime and drafter profiles, with a configuration's overrides;
- ``published``: published figures and the model's predictions of them.
"""
