// DOM and time helpers shared by the pages. Server values enter the page only as text nodes
// and attribute values (never as markup), so nothing a workflow carries can run here.

export function h(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

const SVG = "http://www.w3.org/2000/svg";

/// An SVG element; `class` and every other prop become attributes (no inline styles: CSP).
export function svg(tag, props, ...children) {
  return build(document.createElementNS(SVG, tag), props, children);
}

function build(node, props, children) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class" && node instanceof HTMLElement) node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "value") node.value = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/// Milliseconds as a short duration: `820 ms`, `4.2 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
export function duration(ms) {
  if (!Number.isFinite(ms)) return "—";
  const abs = Math.abs(ms);
  if (abs < 10) return `${ms.toFixed(1)} ms`;
  if (abs < 1000) return `${Math.round(ms)} ms`;
  if (abs < 60_000) return `${(ms / 1000).toFixed(abs < 10_000 ? 1 : 0)} s`;
  const s = Math.round(abs / 1000);
  const [d, hr, min, sec] = [Math.floor(s / 86400), Math.floor(s / 3600) % 24, Math.floor(s / 60) % 60, s % 60];
  const sign = ms < 0 ? "-" : "";
  if (d) return `${sign}${d} d ${hr} h`;
  if (hr) return `${sign}${hr} h ${min} min`;
  return `${sign}${min} min${sec ? ` ${sec} s` : ""}`;
}

/// How long ago (or from now) `ms` is.
export function ago(ms, now = Date.now()) {
  const delta = now - ms;
  if (Math.abs(delta) < 5000) return "just now";
  return delta > 0 ? `${duration(delta)} ago` : `in ${duration(-delta)}`;
}

/// A timestamp as absolute local time and how long ago it was (the ISO value in the tooltip).
export function when(value) {
  if (!value) return "—";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return h("time", { datetime: value, title: value }, date.toLocaleString(), h("span", { class: "ago" }, " · ", ago(date.getTime())));
}

/// How long from `from` to `to` (an open span runs until now).
export function span(from, to) {
  if (!from) return "—";
  const start = Date.parse(from);
  const end = to ? Date.parse(to) : Date.now();
  return h("span", { class: to ? "" : "open-span", title: to ? "" : "still open" }, duration(end - start));
}
