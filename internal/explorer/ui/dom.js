// DOM helpers. The page builds every element with h(): text is set as text,
// never parsed as HTML, so names and tags from the store cannot inject markup.

// h makes an element: attrs holds attributes ("class", "text" for the text,
// "on<event>" for listeners, false/null for none), children are nodes or text.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

// table makes a table with a caption, a header row and rows of cells (a row
// may be {cells, class}), in a box that scrolls when it is too wide.
export function table(caption, head, rows, attrs) {
  return h('div', { class: 'scroll' }, h('table', attrs,
    h('caption', null, caption),
    h('thead', null, h('tr', null, head.map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', null, rows.map((r) => {
      const cells = Array.isArray(r) ? r : r.cells;
      return h('tr', { class: Array.isArray(r) ? null : r.class }, cells.map((c) => h('td', null, c)));
    }))));
}

// field is a labelled control: its label names it for assistive technology.
export function field(label, control, hint) {
  const hintEl = hint ? h('span', { class: 'hint', id: control.id + '-hint' }, hint) : null;
  if (hintEl) control.setAttribute('aria-describedby', hintEl.id);
  return h('div', { class: 'field' }, h('label', { for: control.id }, label), control, hintEl);
}

// errorBox shows an error of the API: its message and field violations.
export function errorBox(err) {
  const violations = [];
  for (const d of err.details || []) {
    for (const v of d.fieldViolations || []) violations.push(`${v.field}: ${v.description}`);
  }
  return h('div', { class: 'error', role: 'alert' },
    h('strong', null, err.codeName ? `${err.codeName}: ` : 'Error: '), err.message || String(err),
    violations.length ? h('ul', null, violations.map((v) => h('li', null, v))) : null);
}

// enumText strips an enum value's prefix: ACTION_ALLOW → ALLOW.
export function enumText(v, prefix) {
  if (!v) return '-';
  return String(v).startsWith(prefix) ? String(v).slice(prefix.length) : String(v);
}

// actionCell shows an action, coloured.
export function action(a, audit) {
  const t = enumText(a || 'ACTION_UNSPECIFIED', 'ACTION_');
  return h('span', { class: t === 'ALLOW' ? 'act-allow' : t === 'DENY' ? 'act-deny' : null }, t,
    audit ? [' ', h('span', { class: 'audit' }, 'audit')] : null);
}

export const dash = (s) => (s === undefined || s === null || s === '' ? '-' : String(s));

// tagsText: "app=web,env=prod", sorted by key.
export function tagsText(tags) {
  const keys = Object.keys(tags || {}).sort();
  return keys.length ? keys.map((k) => `${k}=${tags[k]}`).join(',') : 'no tags';
}

// tagList shows tags as chips.
export function tagList(tags) {
  const keys = Object.keys(tags || {}).sort();
  if (!keys.length) return h('span', { class: 'hint' }, 'no tags');
  return h('span', null, keys.map((k) => h('span', { class: 'tag mono' }, `${k}=${tags[k]}`)));
}

// pageOf is page n (from 1, clamped) of items, size at a time: {n, pages,
// items, first} (first: the number of its first item, from 1).
export function pageOf(items, n, size) {
  const pages = Math.max(1, Math.ceil(items.length / size));
  const k = Math.min(Math.max(1, Number(n) || 1), pages);
  return { n: k, pages, items: items.slice((k - 1) * size, k * size), first: (k - 1) * size + 1 };
}

// pager links a page's neighbours: label names the navigation ("Pages of
// changed flows"), what the items ("flows"); href(k) is page k's URL, and
// the next link's id is idPrefix-next.
export function pager(label, what, p, total, href, idPrefix) {
  return h('nav', { class: 'pager', 'aria-label': label },
    p.n > 1 ? h('a', { href: href(p.n - 1), rel: 'prev', id: `${idPrefix}-prev` }, 'Previous page') : null,
    h('span', null, ` ${what} ${p.first}–${p.first + p.items.length - 1} of ${total} `),
    p.n < p.pages ? h('a', { href: href(p.n + 1), rel: 'next', id: `${idPrefix}-next` }, 'Next page') : null);
}
