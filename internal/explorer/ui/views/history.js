// The history view: the versions of a key, or of every key under a prefix,
// each with its revision, change, time, writer and the diff from the
// document it replaced (PolicyService.History; docs/history.md). It also
// holds the revision bar that the decide and policies views show: a slider
// over the revisions the store still holds, which sets rev= in the URL and
// at_revision on their calls.
//
// URL: ?view=history&key=shop/policies/TrafficPermission/web-to-db
//      ?view=history&key=shop/&prefix=1        every key under shop/
//      &page=TOKEN                             a later page of versions

import { h, field, errorBox, enumText, dash } from '../dom.js';
import { query } from '../ends.js';

const pageSize = 100;

export default {
  name: 'history',
  title: 'History',
  claims: (params) => params.has('key'),
  async render(ctx) {
    const { params, root } = ctx;
    const key = params.get('key') || '';
    const prefix = params.get('prefix') === '1';
    root.replaceChildren(h('h1', null, key ? `History of ${key}${prefix ? '…' : ''}` : 'History'), keyForm(key, prefix, ctx));
    const body = h('section', { id: 'history-body', 'aria-live': 'polite' });
    root.append(body);
    if (!key && !prefix) {
      body.append(h('p', { class: 'hint' }, 'Name a key (shop/policies/TrafficPermission/web-to-db) or a prefix (shop/): ',
        'its versions, who wrote each and what changed appear here.'));
      return;
    }
    ctx.setTitle(`History of ${key}`);
    performance.mark('verdict:history:start');
    let resp;
    try {
      resp = await ctx.api.call('verdict.v1.PolicyService/History', {
        key, prefix, pageSize, pageToken: params.get('page') || '',
      });
    } catch (err) {
      if (err.status === 401 || ctx.stale()) throw err;
      body.append(errorBox(err));
      return;
    }
    if (ctx.stale()) return;
    const versions = resp.versions || [];
    body.append(h('p', { class: 'meta', id: 'history-window' },
      `${versions.length} version${versions.length === 1 ? '' : 's'} written after revision ${dash(resp.fromRevision)} `,
      `and up to ${dash(resp.toRevision)}, oldest first`));
    body.append(versionList(versions, { showKey: prefix }));
    if (resp.nextPageToken) {
      body.append(h('p', null, h('a', {
        id: 'history-next',
        href: query([['view', 'history'], ['key', key], ['prefix', prefix ? '1' : ''], ['page', resp.nextPageToken]]),
      }, 'Later versions')));
    }
    performance.measure('verdict:history', 'verdict:history:start');
  },
};

function keyForm(key, prefix, ctx) {
  const keyIn = h('input', { id: 'history-key', value: key, class: 'wide key', autocomplete: 'off', placeholder: 'shop/policies/TrafficPermission/web-to-db' });
  const prefixIn = h('input', { id: 'history-prefix', type: 'checkbox', checked: prefix });
  return h('form', {
    class: 'query', 'aria-label': 'Key', id: 'history-form',
    onsubmit: (e) => {
      e.preventDefault();
      ctx.navigate(new URLSearchParams({ view: 'history', key: keyIn.value.trim(), prefix: prefixIn.checked ? '1' : '' }), { focus: true });
    },
  }, field('Key', keyIn), h('div', { class: 'field check' }, prefixIn, h('label', { for: 'history-prefix' }, 'every key under it')),
  h('button', { type: 'submit', class: 'primary', id: 'history-submit' }, 'Show'));
}

// meshOf is the mesh of a key: "shop/policies/…" → "shop".
const meshOf = (key) => key.split('/')[0];

// versionList shows versions, each with its diff; showKey names each one's
// key (a prefix's versions are of several keys).
export function versionList(versions, { showKey }) {
  if (!versions.length) return h('p', { id: 'versions' }, 'No version in the window.');
  return h('ol', { class: 'versions', id: 'versions' }, versions.map((v) => {
    const change = enumText(v.change, 'VERSION_CHANGE_').toLowerCase();
    const rev = Number(v.revision);
    const mesh = meshOf(v.key);
    return h('li', { class: 'version', 'data-revision': v.revision },
      h('h3', null, `revision ${v.revision}: ${change}`, showKey ? [' ', h('code', null, v.key)] : null),
      h('dl', { class: 'facts' },
        h('dt', null, 'Writer'), h('dd', { class: 'writer' }, v.writer ? [v.writer, v.via ? ` (${v.via})` : ''] : 'not recorded'),
        h('dt', null, 'Time'), h('dd', { class: 'time' }, v.time ? h('time', { datetime: v.time }, v.time) : '-'),
        h('dt', null, 'The store'), h('dd', null,
          h('a', { href: query([['view', 'policies'], ['mesh', mesh], ['rev', String(rev)]]) }, `policies at revision ${rev}`),
          rev > 1 ? [' · ', h('a', { href: query([['view', 'policies'], ['mesh', mesh], ['rev', String(rev - 1)]]) }, 'just before')] : null)),
      diffBlock(v.previous, v.resource, `The change of revision ${v.revision}`));
  }));
}

// documentOf is the document a stored resource holds: its kind's message.
function documentOf(stored) {
  const r = stored?.resource;
  if (!r) return null;
  return r.policy || r.workload || r.scope || r.mesh || r;
}

// diffBlock shows before → after as a unified diff of their YAML.
export function diffBlock(before, after, label) {
  const a = before ? yamlText(documentOf(before)).split('\n') : [];
  const b = after ? yamlText(documentOf(after)).split('\n') : [];
  if (before && !documentOf(before) && before.error) a.push(`# does not decode: ${before.error}`);
  if (after && !documentOf(after) && after.error) b.push(`# does not decode: ${after.error}`);
  return h('pre', { class: 'diff mono', 'aria-label': label },
    diffLines(a, b).map(([op, line]) => h('span', { class: op === '+' ? 'add' : op === '-' ? 'del' : null }, `${op} ${line}\n`)));
}

// diffLines is a line diff of a and b by their longest common subsequence:
// [op, line] with op ' ', '-' or '+'. Documents are small; a pair too large
// for the table is shown as all of a removed and all of b added.
export function diffLines(a, b) {
  const n = a.length;
  const m = b.length;
  if (n * m > 4e6) return [...a.map((l) => ['-', l]), ...b.map((l) => ['+', l])];
  const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) {
      out.push([' ', a[i]]);
      i++;
      j++;
    } else if (i < n && (j === m || lcs[i + 1][j] >= lcs[i][j + 1])) {
      out.push(['-', a[i++]]);
    } else {
      out.push(['+', b[j++]]);
    }
  }
  return out;
}

// yamlText writes a JSON value as YAML, keys in the document's order.
export function yamlText(v) {
  return yamlLines(v, '').join('\n');
}

function yamlLines(v, indent) {
  if (Array.isArray(v)) {
    if (!v.length) return [`${indent}[]`];
    return v.flatMap((item) => {
      if (isComposite(item)) {
        const inner = yamlLines(item, `${indent}  `);
        return [`${indent}- ${inner[0].trimStart()}`, ...inner.slice(1)];
      }
      return [`${indent}- ${scalar(item)}`];
    });
  }
  if (v && typeof v === 'object') {
    const keys = Object.keys(v);
    if (!keys.length) return [`${indent}{}`];
    return keys.flatMap((k) => {
      const val = v[k];
      if (isComposite(val)) return [`${indent}${scalar(k)}:`, ...yamlLines(val, `${indent}  `)];
      const empty = Array.isArray(val) ? '[]' : val && typeof val === 'object' ? '{}' : scalar(val);
      return [`${indent}${scalar(k)}: ${empty}`];
    });
  }
  return [`${indent}${scalar(v)}`];
}

const isComposite = (v) => (Array.isArray(v) ? v.length > 0 : !!v && typeof v === 'object' && Object.keys(v).length > 0);

// scalar writes a string plain when YAML reads it back as that string, else
// quoted.
function scalar(v) {
  if (v === null || v === undefined) return 'null';
  if (typeof v !== 'string') return String(v);
  const plain = v !== '' && !/^[\s\-?:,[\]{}#&*!|>'"%@`]|[\s:]$|: | #|[\n\t]/.test(v) &&
    !/^(true|false|yes|no|on|off|null|~|[-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?|0x[0-9a-fA-F]+|0o[0-7]+|\.inf|\.nan)$/i.test(v);
  return plain ? v : JSON.stringify(v);
}

// revisionBar is the revision slider of the decide and policies views: from
// the oldest revision the store holds to the current one (a History window of
// the mesh), it sets rev= in the URL. The bar shows at once; the slider's
// bounds fill in when they come.
export function revisionBar(ctx, mesh) {
  const rev = ctx.params.get('rev') || '';
  const input = h('input', { id: 'rev-input', type: 'number', min: 1, value: rev, placeholder: 'now', class: 'rev' });
  const slider = h('input', { id: 'rev-slider', type: 'range', min: 1, max: 1, value: 1, disabled: true });
  slider.addEventListener('input', () => { input.value = slider.value; });
  input.addEventListener('input', () => { if (input.value) slider.value = input.value; });
  const state = h('span', { class: 'hint', id: 'rev-state' }, rev ? `answers as the store was at revision ${rev}` : 'answers at the current revision');
  const form = h('form', {
    class: 'revbar', 'aria-label': 'Revision', id: 'revision',
    onsubmit: (e) => {
      e.preventDefault();
      const p = new URLSearchParams(ctx.params);
      const v = input.value.trim();
      if (v) p.set('rev', v);
      else p.delete('rev');
      ctx.navigate(p, { focus: true });
    },
  },
  field('Revision', slider), field('Revision number', input),
  h('button', { type: 'submit', id: 'rev-submit' }, 'Show'),
  rev ? h('a', { id: 'rev-now', href: query([...ctx.params].filter(([k]) => k !== 'rev')) }, 'Now') : null,
  state);
  ctx.api.call('verdict.v1.PolicyService/History', { key: `${mesh || 'default'}/`, prefix: true, pageSize: 1 }).then((w) => {
    if (ctx.stale()) return;
    const lo = Math.max(Number(w.fromRevision) || 1, 1);
    const hi = Math.max(Number(w.toRevision) || lo, lo);
    slider.min = String(lo);
    slider.max = String(hi);
    slider.value = String(rev ? Math.min(Math.max(Number(rev), lo), hi) : hi);
    slider.disabled = false;
    slider.setAttribute('aria-valuetext', `revision ${slider.value}`);
    slider.addEventListener('input', () => slider.setAttribute('aria-valuetext', `revision ${slider.value}`));
    input.max = String(hi);
    form.dataset.ready = 'true';
  }, () => {
    // Without History (no authorization, say) the number input still works.
    form.dataset.ready = 'true';
  });
  return form;
}
