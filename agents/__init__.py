"""Agent registry: `agents[config['agent_name']]` is the class a driver builds."""

from agents.acfql import ACFQLAgent

agents = dict(
    acfql=ACFQLAgent,
)
