"""Deployment: the topology of processes, docker-compose rendering, credentials and the loopback launcher."""
