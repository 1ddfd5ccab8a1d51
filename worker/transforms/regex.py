"""Java regular expressions and replacement strings, as Connect configs write them, in Python's ``re``.

Connect configs hold Java syntax: named groups ``(?<name>...)`` and replacements with ``$1`` /
``${name}`` (and ``\\$`` for a dollar). The common syntax is shared, so translating those two is
enough for the patterns RegexRouter and TopicNameMatches see in practice; a pattern ``re`` still
rejects is a ConfigError naming the key.
"""

from __future__ import annotations

import re

from eosink.connectors.api.errors import ConfigError

_NAMED_GROUP = re.compile(r"(?<!\\)\(\?<(?![=!])")


def compile_java(pattern: str, *, key: str) -> re.Pattern[str]:
    try:
        return re.compile(_NAMED_GROUP.sub("(?P<", pattern))
    except re.error as exc:
        raise ConfigError(f"invalid regular expression {pattern!r}: {exc}", key=key) from None


def java_replacement(replacement: str, regex: re.Pattern[str], *, key: str) -> str:
    """A ``Match.expand`` template doing what Java's ``Matcher.replaceFirst(replacement)`` does."""
    out: list[str] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 >= n:
                raise ConfigError(f"replacement {replacement!r} ends with a lone backslash", key=key)
            out.append("\\\\" if replacement[i + 1] == "\\" else replacement[i + 1])
            i += 2
        elif c == "$":
            if replacement.startswith("{", i + 1):
                j = replacement.find("}", i + 2)
                name = replacement[i + 2 : j] if j > 0 else ""
                if name not in regex.groupindex:
                    raise ConfigError(f"replacement {replacement!r} names no group of the regex: ${{{name}}}", key=key)
                out.append(f"\\g<{name}>")
                i = j + 1
                continue
            j = i + 1
            if j >= n or not replacement[j].isdigit():
                raise ConfigError(f"replacement {replacement!r} has a '$' without a group at position {i}; "
                                  "write \\$ for a dollar", key=key)
            group = int(replacement[j])
            j += 1
            while j < n and replacement[j].isdigit() and int(replacement[i + 1 : j + 1]) <= regex.groups:
                group = int(replacement[i + 1 : j + 1])
                j += 1
            if group > regex.groups:
                raise ConfigError(f"replacement {replacement!r} refers to group {group}, the regex has "
                                  f"{regex.groups}", key=key)
            out.append(f"\\g<{group}>")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)
