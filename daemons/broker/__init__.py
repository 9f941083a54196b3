"""Managed brokers: mosquitto as a supervised subprocess, amqtt as the fallback."""

from daemons.broker.process import BrokerError, Engine, ManagedBroker
from daemons.broker.settings import BrokerSettings, BrokerTLS, free_port

__all__ = ["BrokerError", "BrokerSettings", "BrokerTLS", "Engine", "ManagedBroker", "free_port"]
