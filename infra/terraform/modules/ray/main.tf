# KubeRay operator (pinned chart), the Ray auth token as a Kubernetes secret, the RayCluster
# rendered from infra/k8s/raycluster.yaml.tftpl (a CPU group and GPU groups, all from zero), and a
# NetworkPolicy: Ray pods reach each other on every port (GCS 6379, dashboard/Jobs 8265, client
# 10001, object and worker ports), the operator reaches the dashboard, nothing else gets in.
resource "helm_release" "kuberay" {
  name             = "kuberay-operator"
  repository       = "https://ray-project.github.io/kuberay-helm/"
  chart            = "kuberay-operator"
  version          = var.kuberay_chart_version
  namespace        = "kuberay-system"
  create_namespace = true
}

resource "random_password" "ray_token" {
  length  = 48
  special = false
}

resource "kubernetes_secret_v1" "ray_token" {
  metadata {
    name      = "ray-auth-token"
    namespace = var.namespace
  }
  data = { token = random_password.ray_token.result }
}

resource "kubernetes_service_account_v1" "ray" {
  metadata {
    name        = "ray"
    namespace   = var.namespace
    annotations = { "eks.amazonaws.com/role-arn" = var.role_arn }
  }
}

locals {
  manifest = templatefile("${path.module}/../../../k8s/raycluster.yaml.tftpl", {
    name          = var.cluster_name
    namespace     = var.namespace
    image         = var.image
    token_secret  = kubernetes_secret_v1.ray_token.metadata[0].name
    tracking_uri  = var.tracking_uri
    mlflow_secret = var.mlflow_secret_name
    storage_uri   = var.storage_uri
    cpu_group     = var.cpu_worker_group
    gpu_groups    = var.gpu_worker_groups
  })
}

resource "kubernetes_manifest" "raycluster" {
  manifest   = yamldecode(local.manifest)
  depends_on = [helm_release.kuberay]
}

resource "kubernetes_network_policy_v1" "ray" {
  metadata {
    name      = "ray-ports"
    namespace = var.namespace
  }
  spec {
    pod_selector {
      match_labels = { "app.kubernetes.io/part-of" = "sieve-ray" }
    }
    policy_types = ["Ingress"]
    ingress {
      from {
        pod_selector {
          match_labels = { "app.kubernetes.io/part-of" = "sieve-ray" }
        }
      }
    }
    ingress {
      from {
        namespace_selector {
          match_labels = { "kubernetes.io/metadata.name" = "kuberay-system" }
        }
      }
      ports {
        port     = "8265"
        protocol = "TCP"
      }
    }
  }
}
