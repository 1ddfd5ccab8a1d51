"""The part of Java's ``SimpleDateFormat`` that Connect configs use, compiled once, always in UTC.

Connect's TimestampConverter and TimestampRouter take Java patterns (``yyyy-MM-dd'T'HH:mm:ss.SSS'Z'``).
This module supports the letters ``yyyy MM dd HH mm ss SSS``, quoted literals (``'T'``, ``'Z'``,
``''`` for a quote) and unquoted punctuation, and compiles a pattern into one ``str.format``
template (formatting) and one regular expression (parsing). Any other pattern letter (``EEE``,
``a``, ``z``, ``X``, ``M`` alone...) is refused with a :class:`ConfigError` naming it, rather than
silently producing something Java would not.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from eosink.connectors.api.errors import ConfigError

#: pattern letters -> (group name, digits, str.format spec)
_FIELDS = {
    "yyyy": ("year", 4, "{0.year:04d}"),
    "MM": ("month", 2, "{0.month:02d}"),
    "dd": ("day", 2, "{0.day:02d}"),
    "HH": ("hour", 2, "{0.hour:02d}"),
    "mm": ("minute", 2, "{0.minute:02d}"),
    "ss": ("second", 2, "{0.second:02d}"),
    "SSS": ("milli", 3, "{1:03d}"),
}
SUPPORTED = "yyyy MM dd HH mm ss SSS, quoted literals such as 'T' or 'Z', and punctuation"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class DateFormat:
    """A compiled pattern: :meth:`format` epoch ms to text, :meth:`parse` text to epoch ms (UTC)."""

    pattern: str
    template: str
    regex: re.Pattern[str]

    def format(self, ms: int) -> str:
        when = EPOCH + dt.timedelta(milliseconds=ms)
        return self.template.format(when, when.microsecond // 1000)

    def parse(self, text: str) -> int:
        m = self.regex.fullmatch(text)
        if m is None:
            raise ValueError(f"{text!r} does not match the format {self.pattern!r}")
        g = m.groupdict()
        when = dt.datetime(int(g.get("year") or 1970), int(g.get("month") or 1), int(g.get("day") or 1),
                           int(g.get("hour") or 0), int(g.get("minute") or 0), int(g.get("second") or 0),
                           int(g.get("milli") or 0) * 1000, tzinfo=dt.UTC)
        return (when - EPOCH) // _MS


def compile_format(pattern: str, *, key: str) -> DateFormat:
    """Compile ``pattern``; a ConfigError under ``key`` names what is not supported."""
    template: list[str] = []
    regex: list[str] = []
    seen: set[str] = set()
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "'":
            j = pattern.find("'", i + 1)
            if j < 0:
                raise ConfigError(f"format {pattern!r} has an unterminated quote at position {i}", key=key)
            lit = "'" if j == i + 1 else pattern[i + 1 : j]
            template.append(lit.replace("{", "{{").replace("}", "}}"))
            regex.append(re.escape(lit))
            i = j + 1
        elif c.isascii() and c.isalpha():
            j = i
            while j < n and pattern[j] == c:
                j += 1
            run = pattern[i:j]
            if run not in _FIELDS:
                raise ConfigError(f"format {pattern!r} uses {run!r}, which is not supported; supported: {SUPPORTED}",
                                  key=key)
            group, digits, spec = _FIELDS[run]
            if group in seen:
                raise ConfigError(f"format {pattern!r} repeats {run!r}", key=key)
            seen.add(group)
            template.append(spec)
            regex.append(f"(?P<{group}>[0-9]{{{digits}}})")
            i = j
        else:
            template.append(c.replace("{", "{{").replace("}", "}}"))
            regex.append(re.escape(c))
            i += 1
    return DateFormat(pattern, "".join(template), re.compile("".join(regex)))
