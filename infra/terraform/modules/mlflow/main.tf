# MLflow tracking server in the cluster: MLflow's basic-auth app (admin credential from a Kubernetes
# secret, a non-admin `sieve-jobs` user whose credential the Ray pods get as MLFLOW_TRACKING_USERNAME
# / MLFLOW_TRACKING_PASSWORD), the PostgreSQL backend whose credential infra/mlflow/serve.py reads
# from Secrets Manager at start (never in a manifest, argv or Terraform state), S3 artifacts served
# through the server, a ClusterIP Service, and a NetworkPolicy that admits port 5000 from Ray pods
# only (people use kubectl port-forward).
locals {
  port = 5000
  # Host headers the server accepts (DNS-rebinding protection). A client sends the port it dialled,
  # so every in-cluster name carries :5000; localhost/127.0.0.1 serve `kubectl port-forward`.
  # tests/infra/test_mlflow_server.py starts a real server with this list and calls it as a job would.
  allowed_hosts = [
    "mlflow:5000",
    "mlflow.${var.namespace}:5000",
    "mlflow.${var.namespace}.svc:5000",
    "mlflow.${var.namespace}.svc.cluster.local:5000",
    "localhost:5000",
    "127.0.0.1:5000",
  ]
  # the Deployment's credential variables, each from a Kubernetes secret (names only in the manifest)
  secret_env = {
    MLFLOW_AUTH_ADMIN_USERNAME     = { secret = kubernetes_secret_v1.admin.metadata[0].name, key = "username" }
    MLFLOW_AUTH_ADMIN_PASSWORD     = { secret = kubernetes_secret_v1.admin.metadata[0].name, key = "password" }
    MLFLOW_FLASK_SERVER_SECRET_KEY = { secret = kubernetes_secret_v1.admin.metadata[0].name, key = "flask_secret_key" }
    SIEVE_JOBS_USERNAME            = { secret = kubernetes_secret_v1.jobs.metadata[0].name, key = "username" }
    SIEVE_JOBS_PASSWORD            = { secret = kubernetes_secret_v1.jobs.metadata[0].name, key = "password" }
  }
}

resource "random_password" "admin" {
  length  = 32
  special = false
}

resource "random_password" "flask" {
  length  = 48
  special = false
}

resource "random_password" "jobs" {
  length  = 32
  special = false
}

resource "kubernetes_secret_v1" "admin" {
  metadata {
    name      = "mlflow-admin"
    namespace = var.namespace
  }
  data = { username = "admin", password = random_password.admin.result, flask_secret_key = random_password.flask.result }
}

resource "kubernetes_secret_v1" "jobs" {
  metadata {
    name      = "mlflow-jobs"
    namespace = var.namespace
  }
  data = { username = "sieve-jobs", password = random_password.jobs.result }
}

resource "kubernetes_service_account_v1" "mlflow" {
  metadata {
    name        = "mlflow"
    namespace   = var.namespace
    annotations = { "eks.amazonaws.com/role-arn" = var.role_arn }
  }
}

resource "kubernetes_deployment_v1" "mlflow" {
  metadata {
    name      = "mlflow"
    namespace = var.namespace
    labels    = { app = "mlflow" }
  }
  spec {
    replicas = 1
    selector {
      match_labels = { app = "mlflow" }
    }
    template {
      metadata {
        labels = { app = "mlflow" }
      }
      spec {
        service_account_name = kubernetes_service_account_v1.mlflow.metadata[0].name
        node_selector        = { "sieve/role" = "system" }
        security_context {
          run_as_non_root = true
          run_as_user     = 1000
        }
        volume {
          name = "tmp"
          empty_dir {
            medium = "Memory"
          }
        }
        container {
          name              = "mlflow"
          image             = var.image
          image_pull_policy = "Always"
          command = ["python", "/app/infra/mlflow/serve.py",
            "--host", "0.0.0.0", "--port", tostring(local.port),
            "--db-secret-arn", var.db_secret_arn,
            "--artifacts-destination", "s3://${var.bucket}/mlflow",
          "--allowed-hosts", join(",", local.allowed_hosts)]
          env {
            name  = "AWS_REGION"
            value = var.region
          }
          # Credentials, each from a Kubernetes secret: the admin's and the CSRF key (MLflow reads them
          # itself), the jobs user's (serve.py creates it or resets its password at start).
          dynamic "env" {
            for_each = local.secret_env
            content {
              name = env.key
              value_from {
                secret_key_ref {
                  name = env.value.secret
                  key  = env.value.key
                }
              }
            }
          }
          volume_mount {
            name       = "tmp"
            mount_path = "/tmp"
          }
          port {
            container_port = local.port
          }
          security_context {
            allow_privilege_escalation = false
            read_only_root_filesystem  = true
            capabilities {
              drop = ["ALL"]
            }
          }
          resources {
            requests = { cpu = "500m", memory = "1Gi" }
            limits   = { cpu = "2", memory = "4Gi" }
          }
          liveness_probe {
            http_get {
              path = "/health"
              port = local.port
            }
            initial_delay_seconds = 30
            period_seconds        = 20
          }
          readiness_probe {
            http_get {
              path = "/health"
              port = local.port
            }
          }
        }
      }
    }
  }
}

resource "kubernetes_service_v1" "mlflow" {
  metadata {
    name      = "mlflow"
    namespace = var.namespace
  }
  spec {
    type     = "ClusterIP"
    selector = { app = "mlflow" }
    port {
      port        = local.port
      target_port = local.port
    }
  }
}

# Only Ray pods (the jobs) reach MLflow; everything else in the cluster is refused.
resource "kubernetes_network_policy_v1" "mlflow" {
  metadata {
    name      = "mlflow-from-ray"
    namespace = var.namespace
  }
  spec {
    pod_selector {
      match_labels = { app = "mlflow" }
    }
    policy_types = ["Ingress"]
    ingress {
      from {
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = var.client_part_of }
        }
      }
      ports {
        port     = tostring(local.port)
        protocol = "TCP"
      }
    }
  }
}
