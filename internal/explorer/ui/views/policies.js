// The policies view: a mesh's policies (PolicyService.List) with the lint
// findings on them (AnalysisService.Lint; docs/lint.md) — severity, kind, the
// witness flow linked to its decide view, the covering rules — and one
// policy's detail: its document (Get), its findings and its versions with
// their diffs (History). With rev= the list and the document are as the
// store was at that revision.
//
// URL: ?view=policies&mesh=shop&type=TrafficPermission&rev=12
//      &after=TOKEN&n=2     a later page of the list (List's page token)
//      &fpage=3             a later page of the findings
//      ?view=policies&mesh=shop&policy=TrafficPermission/web-to-db

import { h, table, field, errorBox, enumText, action, dash } from '../dom.js';
import { query, tagsEnd, decideHref } from '../ends.js';
import { revisionBar, versionList, yamlText } from './history.js';

export default {
  name: 'policies',
  title: 'Policies',
  claims: (params) => params.has('policy'),
  async render(ctx) {
    const { params, root } = ctx;
    const mesh = params.get('mesh') || 'default';
    const type = params.get('type') || '';
    const policy = params.get('policy') || '';
    const rev = params.get('rev') || '';
    root.replaceChildren(h('h1', null, policy ? `Policy ${policy}` : `Policies of mesh ${mesh}`),
      pickForm(mesh, type, policy, rev, ctx), revisionBar(ctx, mesh));
    const body = h('div', { id: 'policies-body', 'aria-live': 'polite' });
    root.append(body);
    performance.mark('verdict:policies:start');
    if (policy) await detail(ctx, body, mesh, policy, rev);
    else await list(ctx, body, mesh, type, rev);
    performance.measure('verdict:policies', 'verdict:policies:start');
  },
};

function pickForm(mesh, type, policy, rev, ctx) {
  const meshIn = h('input', { id: 'pol-mesh', value: mesh, autocomplete: 'off' });
  const typeIn = h('input', { id: 'pol-type', value: type, autocomplete: 'off', placeholder: 'every type' });
  return h('form', {
    class: 'query', 'aria-label': 'Mesh and type', id: 'policies-form',
    onsubmit: (e) => {
      e.preventDefault();
      ctx.navigate(new URLSearchParams([['view', 'policies'], ['mesh', meshIn.value.trim()], ['type', typeIn.value.trim()], ['rev', rev]]),
        { focus: true });
    },
  }, field('Mesh', meshIn), field('Policy type', typeIn),
  h('button', { type: 'submit', class: 'primary', id: 'policies-submit' }, 'Show'),
  policy ? h('a', { href: query([['view', 'policies'], ['mesh', mesh], ['rev', rev]]) }, 'All policies of the mesh') : null);
}

// atRevision is the request fields of a read at rev (none: now).
const atRevision = (rev) => (rev ? { atRevision: rev } : {});

// fail shows an error of a call in place; a missing token is the router's.
function fail(ctx, box, err) {
  if (err.status === 401 || ctx.stale()) throw err;
  box.append(errorBox(err));
}

// columns are the list's columns: a column is a heading and the cell of a
// stored policy. Conditions are the policy's standing conditions (List with
// conditions, docs/lint.md), each condition's message its title.
const columns = [
  { head: 'Policy', cell: (s, mesh, rev) => h('a', { href: policyHref(mesh, policyName(s), rev) }, policyName(s)) },
  { head: 'Scope', cell: (s) => dash(doc(s).scope) },
  { head: 'Rank', cell: (s) => doc(s).rank || 'Default' },
  { head: 'Prio', cell: (s) => String(doc(s).priority || 0) },
  { head: 'Action', cell: (s) => policyAction(doc(s)) },
  { head: 'Mode', cell: (s) => doc(s).mode || 'Enforce' },
  { head: 'Modified', cell: (s) => `revision ${dash(s.modRevision)}` },
  { head: 'Lint', cell: null }, // filled once Lint answers
  { head: 'Conditions', cell: (s) => conditions(s) },
  { head: 'Error', cell: (s) => (s.error ? h('span', { class: 'act-deny' }, s.error) : '-') },
];

const doc = (s) => s.resource?.policy || {};

function conditions(s) {
  const names = s.conditions || [];
  if (!names.length) return '-';
  const msgs = s.conditionMessages || {};
  return h('span', { class: 'conditions' }, ...names.flatMap((c, i) => [
    i ? ', ' : '',
    h('span', { class: c === 'Shadowed' || c === 'Overridden' || c === 'Invalid' ? 'act-deny' : null, title: msgs[c] || null }, c),
  ]));
}
// policyName is "Type/name", from the key: "shop/policies/Type/name".
const policyName = (s) => s.key.split('/').slice(2).join('/');
const policyHref = (mesh, name, rev) => query([['view', 'policies'], ['mesh', mesh], ['policy', name], ['rev', rev]]);

function policyAction(p) {
  if (p.from?.length || p.to?.length || p.targetRef) return 'per item';
  return action(`ACTION_${p.action || 'ALLOW'}`);
}

// pageSize is the policies of one page of the list, and the findings of one
// page of the findings: a mesh of 10,000 policies reads in pages, never as
// one table.
const pageSize = 100;

// list shows one page of the mesh's policies (List from the page token
// after= names) and, once Lint answers, their findings. The list does not
// wait for lint, which judges the whole mesh.
async function list(ctx, body, mesh, type, rev) {
  const { params } = ctx;
  const prefix = type ? `${mesh}/policies/${type}/` : `${mesh}/policies/`;
  const after = params.get('after') || '';
  const n = Math.max(1, Number(params.get('n')) || 1); // the page's number, for its heading
  const linting = ctx.api.call('verdict.v1.AnalysisService/Lint', { mesh, type });
  linting.catch(() => {}); // read below, after the list
  const listBox = h('section', { 'aria-labelledby': 'policies-title' }, h('h2', { id: 'policies-title' }, 'Policies'));
  body.append(listBox);
  const lintCells = new Map(); // "Type/name" → its row's Lint cell
  try {
    const listed = await ctx.api.call('verdict.v1.PolicyService/List', { prefix, pageSize, pageToken: after, conditions: true, ...atRevision(rev) });
    if (ctx.stale()) return;
    const resources = listed.resources || [];
    const first = (n - 1) * pageSize + 1;
    listBox.append(h('p', { class: 'meta', id: 'policies-revision' },
      resources.length ? `policies ${first}–${first + resources.length - 1}${listed.nextPageToken ? '' : ` of ${first + resources.length - 1}`}` : 'no policy',
      ` · page ${n} · revision ${dash(listed.revision)}`, rev ? ' (the store as it was)' : ''));
    const rows = resources.map((s) => columns.map((c) => {
      if (c.head !== 'Lint') return c.cell(s, mesh, rev);
      const cell = h('span', { class: 'lint-pending' }, '…');
      lintCells.set(policyName(s), cell);
      return cell;
    }));
    listBox.append(resources.length
      ? table(`Policies of mesh ${mesh}${type ? `, type ${type}` : ''}, page ${n}`, columns.map((c) => c.head), rows, { id: 'policies' })
      : h('p', null, `Mesh ${mesh} has no ${type || ''} policy${rev ? ` at revision ${rev}` : ''}.`));
    if (n > 1 || listed.nextPageToken) {
      const at = (token, k) => query([['view', 'policies'], ['mesh', mesh], ['type', type], ['rev', rev], ['after', token], ['n', k > 1 ? String(k) : '']]);
      listBox.append(h('nav', { class: 'pager', 'aria-label': 'Pages of policies' },
        n > 1 ? h('a', { href: at('', 1), rel: 'first' }, 'First page') : null,
        h('span', null, ` page ${n} `),
        listed.nextPageToken ? h('a', { href: at(listed.nextPageToken, n + 1), rel: 'next', id: 'policies-next' }, 'Next page') : null));
    }
    performance.measure('verdict:policies:list', 'verdict:policies:start');
  } catch (err) {
    fail(ctx, listBox, err);
  }
  const lintBox = h('section', { 'aria-labelledby': 'lint-title' }, h('h2', { id: 'lint-title' }, 'Lint findings'),
    h('p', { class: 'meta', id: 'lint-summary' }, 'Lint is judging the mesh…'));
  body.append(lintBox);
  let linted;
  try {
    linted = await linting;
  } catch (err) {
    if (ctx.stale()) return;
    lintBox.lastChild.remove();
    for (const cell of lintCells.values()) cell.replaceChildren('?');
    fail(ctx, lintBox, err);
    return;
  }
  if (ctx.stale()) return;
  const findings = new Map(); // "Type/name" → its findings
  for (const f of linted.findings || []) {
    const k = `${f.type}/${f.policy}`;
    if (!findings.has(k)) findings.set(k, []);
    findings.get(k).push(f);
  }
  for (const [name, cell] of lintCells) cell.replaceWith(findingCounts(findings.get(name) || []));
  lintBox.lastChild.remove();
  const fpage = Math.max(1, Number(params.get('fpage')) || 1);
  lintBox.append(...lintReport(linted, mesh, rev, null, {
    n: fpage,
    href: (k) => {
      const p = new URLSearchParams(params);
      p.set('view', 'policies');
      if (k > 1) p.set('fpage', String(k));
      else p.delete('fpage');
      return query(p);
    },
  }));
}

function findingCounts(fs) {
  if (!fs.length) return '-';
  const n = { ERROR: 0, WARNING: 0, INFO: 0 };
  for (const f of fs) n[enumText(f.severity, 'SEVERITY_')]++;
  return h('span', null, Object.entries(n).filter(([, c]) => c).map(([s, c]) =>
    h('span', { class: `sev sev-${s.toLowerCase()}` }, `${c} ${s.toLowerCase()}`)));
}

// lintReport shows a Lint answer: a summary, then the findings (of one
// policy, "Type/name", when only is set), pageSize at a time when paged
// names the page {n, href(k)}.
function lintReport(r, mesh, rev, only, paged) {
  const all = r.findings || [];
  const fs = only ? all.filter((f) => `${f.type}/${f.policy}` === only) : all;
  const count = (s) => fs.filter((f) => f.severity === `SEVERITY_${s}`).length;
  const out = [h('p', { class: 'meta', id: 'lint-summary' },
    `revision ${dash(r.revision)}: ${dash(r.rules)} rules analyzed; ${count('ERROR')} errors, ${count('WARNING')} warnings, ${count('INFO')} info`,
    rev && rev !== r.revision ? ` (lint judges the current revision, not revision ${rev})` : '')];
  if (fs.length) {
    const pages = paged ? Math.ceil(fs.length / pageSize) : 1;
    const n = paged ? Math.min(paged.n, pages) : 1;
    const shown = paged ? fs.slice((n - 1) * pageSize, n * pageSize) : fs;
    const pager = pages > 1 ? h('nav', { class: 'pager', 'aria-label': 'Pages of findings' },
      n > 1 ? h('a', { href: paged.href(n - 1), rel: 'prev' }, 'Previous findings') : null,
      h('span', null, ` findings ${(n - 1) * pageSize + 1}–${(n - 1) * pageSize + shown.length} of ${fs.length} `),
      n < pages ? h('a', { href: paged.href(n + 1), rel: 'next', id: 'findings-next' }, 'Next findings') : null) : null;
    out.push(table(only ? `Lint findings of ${only}` : `Lint findings of mesh ${mesh}${pages > 1 ? `, page ${n} of ${pages}` : ''}`,
      ['Severity', 'Kind', 'Policy', 'Rule', 'Finding', 'Witness', 'Covering or related rules'],
      shown.map((f) => {
        const sev = enumText(f.severity, 'SEVERITY_');
        return {
          class: `finding sev-${sev.toLowerCase()}`,
          cells: [h('span', { class: `sev sev-${sev.toLowerCase()}` }, sev.toLowerCase()),
            enumText(f.kind, 'FINDING_KIND_').toLowerCase().replaceAll('_', ' '),
            f.policy ? h('a', { href: policyHref(f.mesh, `${f.type}/${f.policy}`, '') }, f.policy) : dash(f.scope),
            h('code', null, dash(f.rule)), [f.message, f.introduced ? ' (introduced)' : ''],
            witness(f), related(f.related)],
        };
      }), { id: 'findings' }));
    if (pager) out.push(pager);
  } else {
    out.push(h('p', { id: 'findings' }, 'No finding.'));
  }
  if (r.unproven?.length && !only) out.push(h('p', { class: 'hint' }, `${r.unproven.length} rules were not settled within lint's budget.`));
  for (const n of r.notes || []) out.push(h('p', { class: 'hint' }, `Note: ${n}`));
  return out;
}

// witness shows a finding's witness flow, linked to its decide view.
function witness(f) {
  const w = f.witness;
  if (!w) return '-';
  if (!w.source && !w.destination && w.workloads?.length) return `workloads ${w.workloads.join(', ')}`;
  const src = tagsEnd(w.source);
  const dst = tagsEnd(w.destination);
  const ports = w.protocol ? `${w.protocol}${w.port ? ` ${w.port}` : ''}` : 'no protocol';
  const text = `${tagText(w.source)} → ${tagText(w.destination)} ${ports}`;
  const decided = w.decided ? `: ${w.side} ${enumText(w.decided.action, 'ACTION_')} by ${w.decided.policy || w.decided.rule || '-'}` : '';
  if (!src || !dst) return text + decided;
  return h('span', null, h('a', {
    class: 'witness',
    href: decideHref({ mesh: f.mesh, type: f.type, src, dst, proto: w.protocol, port: w.port }),
  }, text), decided);
}

const tagText = (t) => `{${Object.keys(t || {}).sort().map((k) => `${k}=${t[k]}`).join(',')}}`;

function related(refs) {
  if (!refs?.length) return '-';
  return h('ul', { class: 'plain' }, refs.map((r) => h('li', null,
    r.policy ? h('code', null, r.policy) : r.scope ? `scope ${r.scope}` : '', r.rule ? [' ', h('code', null, r.rule)] : null,
    r.action ? [' ', action(r.action)] : null)));
}

async function detail(ctx, body, mesh, name, rev) {
  const key = `${mesh}/policies/${name}`;
  const type = name.split('/')[0];
  ctx.setTitle(`Policy ${name}`);
  // Lint judges the policy's whole type: the document and its versions are
  // shown first, the findings when Lint answers.
  const linting = ctx.api.call('verdict.v1.AnalysisService/Lint', { mesh, type });
  linting.catch(() => {}); // read below
  const [got, versions] = await Promise.allSettled([
    ctx.api.call('verdict.v1.PolicyService/Get', { key, ...atRevision(rev) }),
    ctx.api.call('verdict.v1.PolicyService/History', { key, pageSize: 1000 }),
  ]);
  if (ctx.stale()) return;
  for (const r of [got, versions]) {
    if (r.status === 'rejected' && r.reason?.status === 401) throw r.reason;
  }
  const docBox = h('section', { 'aria-labelledby': 'document-title' }, h('h2', { id: 'document-title' }, 'Document'));
  body.append(docBox);
  if (got.status === 'rejected') fail(ctx, docBox, got.reason);
  else {
    const s = got.value.resource || {};
    const p = doc(s);
    docBox.append(h('dl', { class: 'facts', id: 'policy-facts' },
      h('dt', null, 'Key'), h('dd', { class: 'mono' }, s.key),
      h('dt', null, 'Scope'), h('dd', null, dash(p.scope)),
      h('dt', null, 'Rank, priority'), h('dd', null, `${p.rank || 'Default'}, ${p.priority || 0}`),
      h('dt', null, 'Action'), h('dd', null, policyAction(p)),
      h('dt', null, 'Mode'), h('dd', null, p.mode || 'Enforce'),
      h('dt', null, 'Revisions'), h('dd', null, `created at ${dash(s.createRevision)}, modified at ${dash(s.modRevision)}`,
        ` · read at ${dash(got.value.revision)}`),
      s.error ? [h('dt', null, 'Error'), h('dd', { class: 'act-deny' }, s.error)] : null),
    h('pre', { class: 'mono document', id: 'policy-document', 'aria-label': `The document of ${name}` }, yamlText(p)));
  }
  const pending = h('p', { class: 'meta', id: 'lint-summary' }, 'Lint is judging the policy\'s type…');
  const lintBox = h('section', { 'aria-labelledby': 'lint-title' }, h('h2', { id: 'lint-title' }, 'Lint findings'), pending);
  body.append(lintBox);
  const histBox = h('section', { 'aria-labelledby': 'versions-title' }, h('h2', { id: 'versions-title' }, 'Versions'),
    h('p', null, h('a', { href: query([['view', 'history'], ['key', key]]) }, 'The history view of this key')));
  body.append(histBox);
  if (versions.status === 'rejected') fail(ctx, histBox, versions.reason);
  else histBox.append(versionList(versions.value.versions || [], { showKey: false }));
  performance.measure('verdict:policies:document', 'verdict:policies:start');
  let linted;
  try {
    linted = await linting;
  } catch (err) {
    if (ctx.stale()) return;
    pending.remove();
    fail(ctx, lintBox, err);
    return;
  }
  if (ctx.stale()) return;
  pending.replaceWith(...lintReport(linted, mesh, rev, name));
}
