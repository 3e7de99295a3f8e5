# lockd's image, built from the repository root:
#   docker build -f deploy/docker/lockd.Dockerfile -t jetlock/lockd .
# The root's .dockerignore keeps .git, .jetlock/ and the deploy secrets out
# of the context. The image runs as uid 65532: files it reads must be
# readable by that uid (docker-compose.yml's lockd-secrets, Kubernetes'
# fsGroup).
FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /lockd ./service/cmd/lockd

# alpine, not distroless: the compose health check needs wget.
FROM alpine:3.22
RUN adduser -D -u 65532 lockd
COPY --from=build /lockd /usr/local/bin/lockd
USER 65532
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/lockd"]
