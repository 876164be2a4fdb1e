# KubeRay operator (pinned chart), the Ray auth token as a Kubernetes secret, the RayCluster
# rendered from infra/k8s/raycluster.yaml.tftpl, and a NetworkPolicy that lets Ray ports be
# reached only by Ray pods and the operator.
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
    name         = var.cluster_name
    namespace    = var.namespace
    image        = var.image
    token_secret = kubernetes_secret_v1.ray_token.metadata[0].name
    tracking_uri = var.tracking_uri
    storage_uri  = var.storage_uri
    gpu_groups   = var.gpu_worker_groups
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
      from {
        namespace_selector {
          match_labels = { "kubernetes.io/metadata.name" = "kuberay-system" }
        }
      }
    }
  }
}
