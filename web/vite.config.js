// Built by CMake (web/build_web_ui.cmake) into the megactx binary; `npm run
// dev` serves the page with hot reload against a running `megactx serve`.
import { defineConfig } from 'vite';

const server = process.env.MEGACTX_URL ?? 'http://127.0.0.1:30000';
const proxied = ['/v1', '/ui/stats', '/ui/model', '/tokenize', '/metrics', '/health'];

export default defineConfig({
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: {
    target: 'es2020',
    outDir: 'dist',
    sourcemap: false,
    // One small page: a single script and stylesheet load fastest.
    cssCodeSplit: false,
    assetsInlineLimit: 0,
    chunkSizeWarningLimit: 400,
  },
  server: { proxy: Object.fromEntries(proxied.map((path) => [path, server])) },
});
