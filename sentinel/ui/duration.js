"use strict";
// Durations as the Sentinel writes them in findings (sentinel/src/history/duration_text.rs,
// the same rule, tested on the same table): "40 s", "2 min", "1 h 45 min", "3 d 4 h" — the
// two largest units, the second rounded to the nearest (half up) and left out when it is 0;
// rounding up may carry ("2 h" for 1 h 59 min 30 s). A global of its own, so that the page's
// tests can call it in the browser.

// eslint-disable-next-line no-unused-vars
function humanDuration(totalSeconds) {
  const UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
  const seconds = Math.round(totalSeconds);
  if (!(seconds > 0)) return "0 s";
  const leading = (s) => UNITS.findIndex(([size]) => s >= size);
  let first = leading(seconds);
  const next = UNITS[first + 1];
  const rounded = next ? Math.floor((seconds + Math.floor(next[0] / 2)) / next[0]) * next[0] : seconds;
  first = leading(rounded);
  const [size, name] = UNITS[first];
  let text = `${Math.floor(rounded / size)} ${name}`;
  const after = UNITS[first + 1];
  if (after) {
    const rest = Math.floor((rounded % size) / after[0]);
    if (rest > 0) text += ` ${rest} ${after[1]}`;
  }
  return text;
}
