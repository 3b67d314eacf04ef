"""A Jepsen-style nemesis for one team on several daemons (issue 42).

Three daemons share one PostgreSQL database; stand-in agents are driven
through their broker sockets and the daemons' control sockets while a
nemesis kills, pauses and cuts the daemons off, restarts PostgreSQL and
fills a state directory's disk. Every operation goes to a history file;
the checker reads it, with the database and the agents' own turn logs at
the end, and proves the guarantees docs/broker.md states or names the
counterexample. Python 3 standard library only.
"""
