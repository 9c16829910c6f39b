"""Weave: durable workflows on Pulse.

``weave.definition`` (language, validation, model), ``weave.definitions`` (versions service),
``weave.http`` (routes); the engine: ``weave.instances``, ``weave.signals``, ``weave.engine``,
``weave.inbox``, ``weave.advancer``, ``weave.timers``, wired by ``weave.runtime``.
"""
