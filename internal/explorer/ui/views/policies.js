// The policies view: a mesh's policies (PolicyService.List) with the lint
// findings on them (AnalysisService.Lint; docs/lint.md) — severity, kind, the
// witness flow linked to its decide view, the covering rules — and one
// policy's detail: its document (Get), its findings and its versions with
// their diffs (History). With rev= the list and the document are as the
// store was at that revision.
//
// URL: ?view=policies&mesh=shop&type=TrafficPermission&rev=12
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
// stored policy. The standing conditions of a policy, once List answers
// them, are one more entry here.
const columns = [
  { head: 'Policy', cell: (s, findings, mesh, rev) => h('a', { href: policyHref(mesh, policyName(s), rev) }, policyName(s)) },
  { head: 'Scope', cell: (s) => dash(doc(s).scope) },
  { head: 'Rank', cell: (s) => doc(s).rank || 'Default' },
  { head: 'Prio', cell: (s) => String(doc(s).priority || 0) },
  { head: 'Action', cell: (s) => policyAction(doc(s)) },
  { head: 'Mode', cell: (s) => doc(s).mode || 'Enforce' },
  { head: 'Modified', cell: (s) => `revision ${dash(s.modRevision)}` },
  { head: 'Lint', cell: (s, findings) => findingCounts(findings.get(policyName(s)) || []) },
  { head: 'Error', cell: (s) => (s.error ? h('span', { class: 'act-deny' }, s.error) : '-') },
];

const doc = (s) => s.resource?.policy || {};
// policyName is "Type/name", from the key: "shop/policies/Type/name".
const policyName = (s) => s.key.split('/').slice(2).join('/');
const policyHref = (mesh, name, rev) => query([['view', 'policies'], ['mesh', mesh], ['policy', name], ['rev', rev]]);

function policyAction(p) {
  if (p.from?.length || p.to?.length || p.targetRef) return 'per item';
  return action(`ACTION_${p.action || 'ALLOW'}`);
}

async function list(ctx, body, mesh, type, rev) {
  const prefix = type ? `${mesh}/policies/${type}/` : `${mesh}/policies/`;
  const [listed, linted] = await Promise.allSettled([
    ctx.api.call('verdict.v1.PolicyService/List', { prefix, pageSize: 1000, ...atRevision(rev) }),
    ctx.api.call('verdict.v1.AnalysisService/Lint', { mesh, type }),
  ]);
  if (ctx.stale()) return;
  for (const r of [listed, linted]) {
    if (r.status === 'rejected' && r.reason?.status === 401) throw r.reason;
  }
  const findings = new Map(); // "Type/name" → its findings
  if (linted.status === 'fulfilled') {
    for (const f of linted.value.findings || []) {
      const k = `${f.type}/${f.policy}`;
      if (!findings.has(k)) findings.set(k, []);
      findings.get(k).push(f);
    }
  }
  const listBox = h('section', { 'aria-labelledby': 'policies-title' }, h('h2', { id: 'policies-title' }, 'Policies'));
  body.append(listBox);
  if (listed.status === 'rejected') fail(ctx, listBox, listed.reason);
  else {
    const resources = listed.value.resources || [];
    listBox.append(h('p', { class: 'meta', id: 'policies-revision' }, `${resources.length} polic${resources.length === 1 ? 'y' : 'ies'}`,
      ` · revision ${dash(listed.value.revision)}`, rev ? ' (the store as it was)' : ''));
    listBox.append(resources.length
      ? table(`Policies of mesh ${mesh}${type ? `, type ${type}` : ''}`, columns.map((c) => c.head),
        resources.map((s) => columns.map((c) => c.cell(s, findings, mesh, rev))), { id: 'policies' })
      : h('p', null, `Mesh ${mesh} has no ${type || ''} policy${rev ? ` at revision ${rev}` : ''}.`));
    if (listed.value.nextPageToken) listBox.append(h('p', { class: 'hint' }, 'The first 1000 policies are listed.'));
  }
  const lintBox = h('section', { 'aria-labelledby': 'lint-title' }, h('h2', { id: 'lint-title' }, 'Lint findings'));
  body.append(lintBox);
  if (linted.status === 'rejected') fail(ctx, lintBox, linted.reason);
  else lintBox.append(...lintReport(linted.value, mesh, rev, null));
}

function findingCounts(fs) {
  if (!fs.length) return '-';
  const n = { ERROR: 0, WARNING: 0, INFO: 0 };
  for (const f of fs) n[enumText(f.severity, 'SEVERITY_')]++;
  return h('span', null, Object.entries(n).filter(([, c]) => c).map(([s, c]) =>
    h('span', { class: `sev sev-${s.toLowerCase()}` }, `${c} ${s.toLowerCase()}`)));
}

// lintReport shows a Lint answer: a summary, then the findings (of one
// policy, "Type/name", when only is set).
function lintReport(r, mesh, rev, only) {
  const all = r.findings || [];
  const fs = only ? all.filter((f) => `${f.type}/${f.policy}` === only) : all;
  const count = (s) => fs.filter((f) => f.severity === `SEVERITY_${s}`).length;
  const out = [h('p', { class: 'meta', id: 'lint-summary' },
    `revision ${dash(r.revision)}: ${dash(r.rules)} rules analyzed; ${count('ERROR')} errors, ${count('WARNING')} warnings, ${count('INFO')} info`,
    rev && rev !== r.revision ? ` (lint judges the current revision, not revision ${rev})` : '')];
  if (fs.length) {
    out.push(table(only ? `Lint findings of ${only}` : `Lint findings of mesh ${mesh}`,
      ['Severity', 'Kind', 'Policy', 'Rule', 'Finding', 'Witness', 'Covering or related rules'],
      fs.map((f) => {
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
  const [got, linted, versions] = await Promise.allSettled([
    ctx.api.call('verdict.v1.PolicyService/Get', { key, ...atRevision(rev) }),
    ctx.api.call('verdict.v1.AnalysisService/Lint', { mesh, type }),
    ctx.api.call('verdict.v1.PolicyService/History', { key, pageSize: 1000 }),
  ]);
  if (ctx.stale()) return;
  for (const r of [got, linted, versions]) {
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
  const lintBox = h('section', { 'aria-labelledby': 'lint-title' }, h('h2', { id: 'lint-title' }, 'Lint findings'));
  body.append(lintBox);
  if (linted.status === 'rejected') fail(ctx, lintBox, linted.reason);
  else lintBox.append(...lintReport(linted.value, mesh, rev, name));
  const histBox = h('section', { 'aria-labelledby': 'versions-title' }, h('h2', { id: 'versions-title' }, 'Versions'),
    h('p', null, h('a', { href: query([['view', 'history'], ['key', key]]) }, 'The history view of this key')));
  body.append(histBox);
  if (versions.status === 'rejected') fail(ctx, histBox, versions.reason);
  else histBox.append(versionList(versions.value.versions || [], { showKey: false }));
}
