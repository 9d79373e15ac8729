-- The engine's log: lines by verbosity level to stdout and to a log file, and a progress
-- display that is one live line on a terminal and plain lines elsewhere (pipes, CI, files).
--
--   local log = require("rnnlua.log").new{verbosity = 3, file = path, progress_interval = 5,
--                                          tty = nil (auto), out = io.output()}
--   log:write(level, fmt, ...)   a line, shown when level <= verbosity (stdout and the file)
--   log:progress(text [, force]) the live line (verbosity >= 3): on a terminal it is redrawn
--                                 in place at most 10 times a second; otherwise, and in the
--                                 file, a plain line at most every progress_interval seconds
--                                 (0: every call), or whenever force is set
--   log:clear_progress()          removes the live line before other output
--   log:close()
--
-- Levels: 0 nothing, 1 epoch summaries and results, 2 also setup, checkpoints, skipped steps
-- and learning-rate decisions, 3 also progress (default), 4 also one line per batch.
-- The file gets the same lines as stdout, each with a time stamp; it is opened for appending,
-- so a resumed run continues the log of the run it resumes.
local M = {}
local rl = require("rnnlua") -- the module table (init.lua registers it before loading its parts)

local Log = {}
Log.__index = Log

local LIVE_INTERVAL = 0.1

function M.new(opts)
  opts = opts or {}
  local verbosity = opts.verbosity or 3
  if math.type(verbosity) ~= "integer" or verbosity < 0 then
    error(string.format("log: verbosity must be an integer >= 0, got %s", tostring(verbosity)), 2)
  end
  -- the default output file, so that io.output(f) captures the log; a live line only when that
  -- is stdout and stdout is a terminal
  local out = opts.out or io.output()
  local tty = opts.tty
  if tty == nil then tty = out == io.stdout and rl.isatty(1) end
  local self = setmetatable({
    verbosity = verbosity, out = out, tty = tty,
    interval = opts.progress_interval or 5, live = false, last_live = -math.huge,
    last_plain = -math.huge,
  }, Log)
  if opts.file then
    local f, err = io.open(opts.file, "a")
    if not f then error(string.format("log: cannot open log_file: %s", err), 2) end
    self.file, self.path = f, opts.file
  end
  return self
end

-- A line the file cannot take (a full disk, a folder remounted read-only) is an error naming
-- the file and the cause: the run stops rather than going on with a log that lost lines.
function Log:to_file(line)
  if self.file then
    local ok, err = self.file:write(os.date("%Y-%m-%d %H:%M:%S "), line, "\n")
    if ok then ok, err = self.file:flush() end
    if not ok then
      local f = self.file
      self.file = nil
      f:close()
      error(string.format("log: cannot write log_file %s: %s", self.path,
        tostring(err):gsub("^[^:]*: ", "")), 0)
    end
  end
end

function Log:clear_progress()
  if self.live then
    self.out:write("\r\27[K")
    self.out:flush()
    self.live = false
  end
end

function Log:write(level, fmt, ...)
  if level > self.verbosity then return end
  local line = select("#", ...) > 0 and string.format(fmt, ...) or fmt
  self:clear_progress()
  self.out:write(line, "\n")
  self.out:flush()
  self:to_file(line)
end

function Log:progress(text, force)
  if self.verbosity < 3 then return end
  local now = rl.clock()
  if self.tty then
    if force or now - self.last_live >= LIVE_INTERVAL then
      self.out:write("\r\27[K", text)
      self.out:flush()
      self.live, self.last_live = true, now
    end
  elseif force or now - self.last_plain >= self.interval then
    self.out:write(text, "\n")
    self.out:flush()
  end
  if force or now - self.last_plain >= self.interval then
    self.last_plain = now
    self:to_file(text)
  end
end

function Log:close()
  self:clear_progress()
  if self.file then
    self.file:close()
    self.file = nil
  end
end

return M
