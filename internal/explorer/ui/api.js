// The explorer's API: POST /api/<service>/<method> with the request as
// protojson; the answer is the response as protojson, or a google.rpc.Status
// as JSON with the HTTP status of its gRPC code (docs/explorer.md).

const tokenKey = 'verdict.token';

// The bearer token lives in this tab's sessionStorage only.
export const token = () => sessionStorage.getItem(tokenKey) || '';
export const setToken = (t) => sessionStorage.setItem(tokenKey, t);
export const clearToken = () => sessionStorage.removeItem(tokenKey);

const codeNames = ['OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND',
  'ALREADY_EXISTS', 'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED',
  'OUT_OF_RANGE', 'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED'];

// APIError is a refused call: its HTTP status, gRPC code and message, and the
// status's details (BadRequest's field violations).
export class APIError extends Error {
  constructor(httpStatus, st) {
    super(st.message || `HTTP ${httpStatus}`);
    this.status = httpStatus;
    this.code = st.code || 0;
    this.codeName = codeNames[this.code] || `HTTP ${httpStatus}`;
    this.details = st.details || [];
  }
}

// call calls a method ("verdict.v1.DecisionService/Decide") with a request
// object and returns the response object.
export async function call(method, request) {
  return (await post(`/api/${method}`, request)).body;
}

// page calls a method whose answer is a stream of pages (Reach) and returns
// page n (from 0) and the number of pages: {body, pages}.
export async function page(method, request, n) {
  const { body, resp } = await post(`/api/${method}?page=${n}`, request);
  return { body, pages: Number(resp.headers.get('Verdict-Pages')) || 1 };
}

async function post(url, request) {
  const headers = { 'Content-Type': 'application/json' };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const resp = await fetch(url, {
    method: 'POST', headers, body: JSON.stringify(request || {}), cache: 'no-store', credentials: 'omit',
  });
  const text = await resp.text();
  let body = {};
  try {
    body = text ? JSON.parse(text) : {};
  } catch {
    body = { message: text.trim() };
  }
  if (!resp.ok) throw new APIError(resp.status, body);
  return { body, resp };
}
