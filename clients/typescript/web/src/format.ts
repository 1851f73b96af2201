/**
 * Numbers and times as the console shows them: times relative to now ("3 min ago") with the
 * absolute time on hover, token counts short ("12.3k"), byte counts in words. No DOM here but
 * `timeElement`, which the page's ticker keeps current (`refreshTimes`).
 */
import { timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";

/** `ms` (a time) relative to `now`: "just now", "12 s ago", "3 min ago", "2 h ago", "4 d ago",
 *  or "in 5 s" for a time ahead. */
export function relative(ms: number, now = Date.now()): string {
  const seconds = Math.round((now - ms) / 1000);
  const ahead = seconds < 0;
  const size = Math.abs(seconds);
  let text: string;
  if (size < 5) {
    return "just now";
  } else if (size < 60) {
    text = `${size} s`;
  } else if (size < 3600) {
    text = `${Math.floor(size / 60)} min`;
  } else if (size < 86_400) {
    text = `${Math.floor(size / 3600)} h`;
  } else {
    text = `${Math.floor(size / 86_400)} d`;
  }
  return ahead ? `in ${text}` : `${text} ago`;
}

/** `ms` as a full local date and time, with the UTC offset's zone name when the browser has it. */
export function absolute(ms: number): string {
  return new Date(ms).toLocaleString(undefined, {
    year: "numeric",
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    timeZoneName: "short",
  });
}

/** The milliseconds of a protobuf timestamp, or undefined when unset. */
export function msOf(time: Timestamp | undefined): number | undefined {
  return time === undefined ? undefined : timestampMs(time);
}

/** A `<time>` showing `ms` relative to now, the absolute time as its title (hover) and
 *  `datetime`; `refreshTimes` rewrites the relative text. */
export function timeElement(ms: number | undefined, empty = "—"): HTMLElement {
  if (ms === undefined || ms <= 0) {
    return Object.assign(document.createElement("span"), { textContent: empty, className: "dim" });
  }
  const element = document.createElement("time");
  element.dateTime = new Date(ms).toISOString();
  element.title = absolute(ms);
  element.dataset.ms = String(ms);
  element.className = "relative";
  element.textContent = relative(ms);
  return element;
}

/** Rewrite the relative text of every `timeElement` under `root`. */
export function refreshTimes(root: ParentNode, now = Date.now()): void {
  for (const element of root.querySelectorAll<HTMLElement>("time.relative")) {
    element.textContent = relative(Number(element.dataset.ms), now);
  }
}

/** A token count, short: 950, 12.3k, 4.56M. */
export function tokens(count: bigint | number): string {
  const n = Number(count);
  if (n < 1000) {
    return String(n);
  }
  if (n < 1_000_000) {
    return `${trim(n / 1000)}k`;
  }
  return `${trim(n / 1_000_000)}M`;
}

function trim(value: number): string {
  return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
}

/** A byte count in words: "812 bytes", "13.0 KB", "2.4 MB" (powers of 1,024). */
export function byteSize(count: number): string {
  if (count < 1024) {
    return `${count} bytes`;
  }
  if (count < 1024 * 1024) {
    return `${(count / 1024).toFixed(1)} KB`;
  }
  return `${(count / 1024 / 1024).toFixed(1)} MB`;
}

/** A duration in seconds, short: "850 ms", "3.2 s", "4 min 5 s". */
export function duration(ms: number): string {
  if (ms < 1000) {
    return `${Math.max(0, Math.round(ms))} ms`;
  }
  if (ms < 60_000) {
    return `${(ms / 1000).toFixed(1)} s`;
  }
  const minutes = Math.floor(ms / 60_000);
  return `${minutes} min ${Math.round((ms - minutes * 60_000) / 1000)} s`;
}

/** The UTF-8 size of `text`. */
export function utf8Bytes(text: string): number {
  return new TextEncoder().encode(text).length;
}
