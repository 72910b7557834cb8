// An OAuth 2.0 token endpoint for ottla's OIDC tests: oauth2-mock-server (npm, pinned
// in scripts/install-peers.sh) with the client-credentials grant. The mock accepts any
// client, so this script checks HTTP Basic authentication against the one client it is
// given (401 invalid_client otherwise, as a real provider answers), puts the client id
// in the token's `sub` (as Okta does for client credentials) and gives tokens the
// lifetime asked for, in `exp` and in `expires_in`.
//
// usage: node oauth_server.mjs MODULE_PATH CLIENT_ID CLIENT_SECRET TTL_SECONDS [KEY CERT]
// (with KEY and CERT, PEM files, it serves https).
// Prints `jwks {"keys":[...]}` (its public signing keys), `listening PORT`, then one line per token request:
// `issued SIGNATURE` (the token's signature, for the test that no log carries it) and
// `token CLIENT_ID scope=SCOPE grant=GRANT content-type=TYPE`, or `refused REASON`.
const [modulePath, clientId, clientSecret, ttlArg, key, cert] = process.argv.slice(2);
const ttl = Number(ttlArg);
const { OAuth2Server } = await import(modulePath);

const server = new OAuth2Server(key, cert);
await server.issuer.keys.generate('RS256');

server.service.on('beforeTokenSigning', (token, _req) => {
  token.payload.sub = clientId;
  token.payload.exp = token.payload.iat + ttl;
});

server.service.on('beforeResponse', (response, req) => {
  const header = req.headers.authorization ?? '';
  const basic = header.startsWith('Basic ')
    ? Buffer.from(header.slice(6), 'base64').toString('utf8')
    : '';
  const [id, ...rest] = basic.split(':');
  const secret = rest.join(':');
  if (decodeURIComponent(id.replace(/\+/g, ' ')) !== clientId ||
      decodeURIComponent(secret.replace(/\+/g, ' ')) !== clientSecret) {
    response.statusCode = 401;
    response.body = { error: 'invalid_client', error_description: 'Client authentication failed' };
    console.log(`refused client ${id}`);
    return;
  }
  response.body.expires_in = ttl;
  console.log(`issued ${response.body.access_token.split('.')[2]}`);
  console.log(`token ${id} scope=${req.body.scope ?? ''} grant=${req.body.grant_type} content-type=${req.headers['content-type']}`);
});

await server.start(0, '127.0.0.1');
console.log(`jwks ${JSON.stringify(server.issuer.keys.toJSON())}`);
console.log(`listening ${server.address().port}`);
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
