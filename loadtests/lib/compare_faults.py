"""The faults ``make compare`` injects, and the private servers they need.

Three conditions per combination:

``none``      no fault.
``stall``     the process holding the sku's flush lock is SIGSTOPped for twice the
              lease, then continued: its lease (ZooKeeper: its session) runs out
              under it, the other gateway takes over, and the woken holder must be
              fenced out. The holder is found from the lock itself (Redis: the
              owner's pid in the lock hash; ZooKeeper: in the lowest node's data);
              PostgreSQL's advisory lock and ``none`` do not say, so the second
              gateway is stopped.
``failover``  Redis families: the Sentinel-managed primary is SIGKILLed and the
              replica promoted. ZooKeeper rows: every gateway's session expires
              instead (the proxy in front of ZooKeeper swallows everything for
              twice the session timeout, then heals).

Every server here is private, on a free port, and stopped by :class:`Servers`.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from redis import Redis

from gateway.lock.zookeeper import ROOT
from gateway.redis.layout import lock_key
from loadtests.lib.targets import Target
from testkit.proxy import FaultProxy
from testkit.sentinels import RedisSentinelCluster
from testkit.zookeeper_servers import ZooKeeperServer

CONDITIONS = ("none", "stall", "failover")
MASTER = "flashsale"


@dataclass
class Servers:
    """The ZooKeeper (behind a fault proxy) the run needs; Sentinel sets per round."""

    zookeeper: ZooKeeperServer | None = None
    zk_proxy: FaultProxy | None = None
    sentinels: list[RedisSentinelCluster] = field(default_factory=list)

    def start_zookeeper(self) -> str:
        """Start ZooKeeper and its proxy once; the hosts string gateways use."""
        if self.zookeeper is None:
            self.zookeeper = ZooKeeperServer()
            asyncio.run(self.zookeeper.start())
            self.zk_proxy = FaultProxy("127.0.0.1", self.zookeeper.port, name="zookeeper").start()
        assert self.zk_proxy is not None
        host, port = self.zk_proxy.address
        return f"{host}:{port}"

    def sentinel_set(self) -> RedisSentinelCluster:
        """A fresh primary, replica and three Sentinels (a failover spends one)."""
        cluster = RedisSentinelCluster(MASTER)
        self.sentinels.append(cluster)
        asyncio.run(cluster.start())
        return cluster

    def close(self) -> None:
        """Stop everything started, whatever failed before."""
        for cluster in self.sentinels:
            asyncio.run(cluster.close())
        self.sentinels.clear()
        if self.zk_proxy is not None:
            self.zk_proxy.stop()
        if self.zookeeper is not None:
            asyncio.run(self.zookeeper.close())


def holder_pid(lock: str, *, redis_url: str, zk_hosts: str | None, prefix: str, sku: str) -> int:
    """The pid of the process holding the sku's flush lock now, 0 if unknown or free."""
    name = lock_key(prefix, sku)
    if lock == "redis":
        with Redis.from_url(redis_url) as redis:
            owner = redis.hget(name, "owner")
        return int(owner.split(b":")[0]) if owner else 0
    if lock == "zookeeper" and zk_hosts is not None:
        client = KazooClient(hosts=zk_hosts, timeout=5.0)
        client.start(timeout=5)
        try:
            path = f"{ROOT}/{name}"
            children = sorted(client.get_children(path), key=lambda n: n[-10:])
            if not children:
                return 0
            data, _ = client.get(f"{path}/{children[0]}")
            return int(data.split(b":")[0])
        finally:
            client.stop()
            client.close()
    return 0


def stall_holder(gateways: list[Target], pid: int, seconds: float) -> tuple[str, Target]:
    """SIGSTOP the holder (``pid`` if it is one of ``gateways``, else the last) for
    ``seconds``, then SIGCONT; what was done, for the results, and whom."""
    victim = next((g for g in gateways if g.pid == pid), gateways[-1])
    victim.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        victim.process.send_signal(signal.SIGCONT)
    known = "the lock holder" if victim.pid == pid else "a gateway (holder unknown)"
    return f"SIGSTOP {known} {victim.name} for {seconds:g}s", victim


def fail_over(cluster: RedisSentinelCluster) -> str:
    """Kill the primary and wait for the Sentinels to promote the replica."""
    started = time.monotonic()
    old = asyncio.run(cluster.kill_primary())
    asyncio.run(cluster.wait_for_failover(within=30, old=old))
    return f"primary killed, replica promoted in {time.monotonic() - started:.1f}s"


def expire_sessions(proxy: FaultProxy, seconds: float) -> str:
    """Swallow all ZooKeeper traffic for ``seconds`` (past the session timeout)."""
    proxy.blackhole(True)
    try:
        time.sleep(seconds)
    finally:
        proxy.blackhole(False)
    return f"ZooKeeper unreachable for {seconds:g}s: every gateway session expired"
