# actionledger: the fleet (`actionledger start`) in one image. Two stages, the same steps as
# test/deploy/production-install.test.ts: build and pack with the dev dependencies, then a production install
# of the packed files (`npm ci --omit=dev`), run as a non-root user under tini so SIGTERM reaches the service
# and its workers drain (dispatcher.shutdown_deadline_ms) before the container stops.

FROM node:20-bookworm-slim AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts
COPY . .
RUN npm run build --silent && node bin/build-if-stale.mjs && npm pack --silent --pack-destination /pack \
  && cp package-lock.json /pack/

FROM node:20-bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY --from=build /pack/ /tmp/pack/
RUN tar -xzf /tmp/pack/actionledger-*.tgz --strip-components=1 -C /app \
  && cp /tmp/pack/package-lock.json /app/ && rm -rf /tmp/pack \
  && npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
# The data folder (the embedded PostgreSQL, when DATABASE_URL is unset; the development sandbox) is the only
# place the service writes: mount a volume there, or run with a read-only root filesystem and DATABASE_URL.
ENV NODE_ENV=production ACTIONLEDGER_DATA_DIR=/data
RUN mkdir /data && chown node:node /data
USER node
EXPOSE 7420
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s \
  CMD node -e "fetch('http://127.0.0.1:'+(process.env.PORT||7420)+'/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
ENTRYPOINT ["/usr/bin/tini", "--", "node", "dist/bin/actionledger.js"]
CMD ["start"]
