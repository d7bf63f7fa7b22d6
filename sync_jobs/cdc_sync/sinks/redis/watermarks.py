"""Applied watermarks in the cache: hash `<prefix>:_cdc:watermarks`, field = topic, value = the
WAL position as a decimal string, raised only (a Lua script compares, so it never goes down).

Decimal strings are compared by length, then text: exact for every 64-bit position, where Lua's
numbers (doubles) are not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import redis

from cdc_sync.core.retry import RetryPolicy, retried
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.redis.client import is_transient

RAISE_SCRIPT = """
local function higher(new, old)
  if #new ~= #old then return #new > #old end
  return new > old
end
for i = 1, #ARGV, 2 do
  local stored = redis.call('HGET', KEYS[1], ARGV[i])
  if not stored or higher(ARGV[i + 1], stored) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 1
"""


class CacheWatermarks:
    def __init__(self, client: redis.Redis, policy: RetryPolicy) -> None:
        self.client = client
        self.policy = policy
        self.script = client.register_script(RAISE_SCRIPT)

    def record(self, routes: Mapping[str, TableRoute], position: int) -> None:
        by_key: dict[str, list[str]] = defaultdict(list)
        for topic, route in sorted(routes.items()):
            if route.cache is not None:
                by_key[route.cache.watermarks_key()] += [topic, str(position)]
        for key, args in by_key.items():
            retried(
                lambda key=key, args=args: self.script(keys=[key], args=args),  # type: ignore[misc]
                is_transient,
                f"redis watermark {key}",
                self.policy,
            )
