// Starts `megactx serve` on loopback for the node end-to-end tests.
//
// The server prints "megactx serving NAME at http://HOST:PORT" once it
// listens; --port 0 lets the OS pick a free port, so test files running one
// after the other (or at once) never collide. The binary and model come from
// --megactx / --model on the command line or MEGACTX_BIN / MEGACTX_MODEL.
import { spawn } from 'node:child_process';
import readline from 'node:readline';

export function argument(name, environment) {
  const index = process.argv.indexOf(name);
  if (index >= 0 && index + 1 < process.argv.length) return process.argv[index + 1];
  if (process.env[environment]) return process.env[environment];
  throw new Error(`missing ${name} (or ${environment})`);
}

// Resolves to { server, baseURL } once the server listens.
export async function startServer(name, extraArgs = []) {
  const megactx = argument('--megactx', 'MEGACTX_BIN');
  const model = argument('--model', 'MEGACTX_MODEL');
  const server = spawn(megactx, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0',
    '--served-model-name', name, '--kv-memory', '256MiB', ...extraArgs],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  const log = [];
  server.stderr.on('data', (data) => log.push(data.toString()));
  const baseURL = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log.join(''))), 300000);
    server.on('exit', (code) => reject(new Error(`server exited with ${code}:\n` + log.join(''))));
    readline.createInterface({ input: server.stdout }).on('line', (line) => {
      const match = /at (http:\/\/\S+)/.exec(line);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
  });
  return { server, baseURL };
}

export function stopServer(server) {
  if (server && server.exitCode === null) server.kill('SIGTERM');
}
