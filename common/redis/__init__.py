"""Redis as every process reaches it: the URL forms, the client, the Lua scripts loaded,
which failed calls are sent again, what a refusal means, start-up through an outage.

- `url`: the URL forms (``redis://``, ``rediss://``, ``redis+sentinel://``);
- `connection`: a URL to a client (`connect`, `open_redis`);
- `adapter`: all that reaches into redis-py, bounded to the releases its tests pass on;
- `retry` + `resend`: which failed calls are sent again, and which scripts may run twice;
- `errors`: what a command says when Redis refuses (`REDIS_ERRORS`);
- `wait`: WAIT after a write (`replica_wait`);
- `scripts`: the Lua scripts of ``common/lua`` assembled and registered;
- `durability`: the server settings a crawl survives by;
- `startup`: a command's start-up through an outage (`StartupWait`);
- `server`: a local redis-server for tests, benches and the demo.

Inside this package ``import redis`` is redis-py (imports are absolute).
"""

from common.redis.connection import RedisClient, connect, open_redis
from common.redis.durability import EVICTION_ADVICE, UNKNOWN, ServerSettings, server_settings
from common.redis.errors import REDIS_ERRORS, redis_error_message
from common.redis.resend import may_run_again
from common.redis.retry import resending
from common.redis.scripts import LuaScript, Scripts, load_registered, locate_in, register
from common.redis.server import RedisServer
from common.redis.startup import RedisGaveUpError, StartupStopped, StartupWait, outage
from common.redis.url import check_redis_url
from common.redis.wait import acknowledged, replica_wait

__all__ = [
           "EVICTION_ADVICE",
           "REDIS_ERRORS",
           "UNKNOWN",
           "LuaScript",
           "RedisClient",
           "RedisGaveUpError",
           "RedisServer",
           "Scripts",
           "ServerSettings",
           "StartupStopped",
           "StartupWait",
           "acknowledged",
           "check_redis_url",
           "connect",
           "load_registered",
           "locate_in",
           "may_run_again",
           "open_redis",
           "outage",
           "redis_error_message",
           "register",
           "replica_wait",
           "resending",
           "server_settings",
]
