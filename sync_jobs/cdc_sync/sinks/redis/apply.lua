-- Fenced apply of one change to one cache key, atomically (Redis runs a script without
-- interleaving other commands).
--
-- KEYS[1]  row key (a HASH: `row` = JSON of the routed row, `version` = padded version)
-- KEYS[2]  tombstone key (a STRING: the delete's padded version, expiring after the retention)
-- ARGV[1]  "upsert" | "delete" | "forget" (a compacted topic's tombstone without a version:
--          delete whatever is stored, remembering the stored version as the tombstone) |
--          "mark" (a soft delete: an upsert over the stored row that keeps every stored member
--          the mark does not carry; with no stored row, the delete: a row the cache never held
--          is not marked)
--          | "drop_foreign" (repair: delete a foreign row key, below, if its version field
--          still holds ARGV[2], the value repair read; "" for none: nothing wrote it since)
-- ARGV[2]  version: the LSN as a 20-digit zero-padded decimal string
-- ARGV[3]  upsert, mark: JSON object of the row, without its unchanged TOAST columns
-- ARGV[4]  upsert: JSON array of the unchanged TOAST column names (merged from the stored row)
-- ARGV[5]  upsert, mark: row TTL in seconds, "0" = no expiry
-- ARGV[6]  delete, mark: tombstone TTL in seconds (the tombstone retention)
-- Returns 1 when applied (equal version = re-apply, harmless), 0 when fenced.
--
-- Versions are compared as strings, never as numbers: Lua numbers are doubles, exact only up to
-- 2^53, and LSNs go up to 2^64. Zero-padded to the same width, byte order = numeric order.
--
-- A version field (or tombstone) that is not 20 digits was not written by this script: the key
-- is foreign (something else wrote under the prefix). A foreign version orders nothing: it
-- fences no change and is never kept as a tombstone; the change is applied as over no row.
--
-- The TOAST merge splices raw JSON text instead of cjson.decode/encode of the rows: cjson turns
-- every number into a double and prints 14 significant digits (12345678901234567 comes back as
-- 1.2345678901235e+16), which would corrupt the row's other columns. cjson only decodes strings
-- here (member names), which it does exactly.

local function skip_space(s, i)
  return string.find(s, "[^ \t\r\n]", i)
end

-- index of the closing quote of the JSON string that opens at s[i]
local function string_end(s, i)
  local j = i + 1
  while true do
    local k = string.find(s, '["\\]', j)
    if not k then error("stored row: unterminated string") end
    if string.sub(s, k, k) == '"' then return k end
    j = k + 2 -- skip the escaped character
  end
end

-- index of the last character of the JSON value that starts at s[i]
local function value_end(s, i)
  local c = string.sub(s, i, i)
  if c == '"' then return string_end(s, i) end
  if c == "{" or c == "[" then
    local depth, j = 0, i
    while true do
      local k = string.find(s, '[%[%]{}"]', j)
      if not k then error("stored row: unbalanced brackets") end
      local ch = string.sub(s, k, k)
      if ch == '"' then
        j = string_end(s, k) + 1
      else
        depth = depth + ((ch == "{" or ch == "[") and 1 or -1)
        if depth == 0 then return k end
        j = k + 1
      end
    end
  end
  local k = string.find(s, "[,}%]%s]", i) -- number, true, false, null
  if not k then error("stored row: truncated value") end
  return k - 1
end

-- top-level members of a JSON object: name -> raw `"name":value` text, and the names in order
local function members(s)
  local found, order = {}, {}
  local i = skip_space(s, 1)
  if not i or string.sub(s, i, i) ~= "{" then error("stored row: not a JSON object") end
  i = skip_space(s, i + 1)
  if string.sub(s, i, i) == "}" then return found, order end
  while true do
    if string.sub(s, i, i) ~= '"' then error("stored row: expected a member name") end
    local name_end = string_end(s, i)
    local name = cjson.decode(string.sub(s, i, name_end))
    local colon = skip_space(s, name_end + 1)
    local start = skip_space(s, colon + 1)
    local stop = value_end(s, start)
    found[name] = string.sub(s, i, name_end) .. ":" .. string.sub(s, start, stop)
    table.insert(order, name)
    i = skip_space(s, stop + 1)
    local sep = string.sub(s, i, i)
    if sep == "}" then return found, order end
    if sep ~= "," then error("stored row: expected , or }") end
    i = skip_space(s, i + 1)
  end
end

-- the incoming row with the stored values of its unchanged TOAST columns added
local function merge_unavailable(row, stored_row, unavailable)
  local stored = members(stored_row)
  local extra = {}
  for _, name in ipairs(unavailable) do
    if stored[name] then table.insert(extra, stored[name]) end
  end
  if #extra == 0 then return row end
  local body = string.sub(row, 1, -2) -- drop the closing brace
  if string.match(body, "^%s*{%s*$") then
    return body .. table.concat(extra, ",") .. "}"
  end
  return body .. "," .. table.concat(extra, ",") .. "}"
end

-- the stored members a mark does not carry, in stored order
local function not_carried(row, stored_row)
  local own = members(row)
  local _, order = members(stored_row)
  local names = {}
  for _, name in ipairs(order) do
    if not own[name] then table.insert(names, name) end
  end
  return names
end

-- the version when this script wrote it (20 digits), else nil (absent, or foreign)
local function ours(version)
  if version and #version == 20 and not string.find(version, "%D") then return version end
  return nil
end

local held = redis.call("HGET", KEYS[1], "version")
if ARGV[1] == "drop_foreign" then
  if ours(held) or (held or "") ~= ARGV[2] or redis.call("EXISTS", KEYS[1]) == 0 then
    return 0
  end
  redis.call("DEL", KEYS[1])
  return 1
end

local stored_version = ours(held)
if ARGV[1] == "forget" then
  if held then
    redis.call("DEL", KEYS[1])
    if stored_version then
      redis.call("SET", KEYS[2], stored_version, "EX", tonumber(ARGV[6]))
    end
  end
  return 1
end

local version = ARGV[2]
if stored_version and stored_version > version then return 0 end
local tombstone = ours(redis.call("GET", KEYS[2]))
if tombstone and tombstone > version then return 0 end

local op = ARGV[1]
local row = ARGV[3]
if op == "mark" then
  local stored_row = stored_version and redis.call("HGET", KEYS[1], "row")
  if stored_row then
    row = merge_unavailable(row, stored_row, not_carried(row, stored_row))
  else
    op = "delete"
  end
end

if op == "delete" then
  redis.call("DEL", KEYS[1])
  redis.call("SET", KEYS[2], version, "EX", tonumber(ARGV[6]))
  return 1
end

local unavailable = cjson.decode(ARGV[4])
if #unavailable > 0 and stored_version then
  local stored_row = redis.call("HGET", KEYS[1], "row")
  if stored_row then row = merge_unavailable(row, stored_row, unavailable) end
end
redis.call("HSET", KEYS[1], "row", row, "version", version)
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call("EXPIRE", KEYS[1], ttl)
else
  redis.call("PERSIST", KEYS[1])
end
if tombstone then redis.call("DEL", KEYS[2]) end -- older than this row: the row fences now
return 1
