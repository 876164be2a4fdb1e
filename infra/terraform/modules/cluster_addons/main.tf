# What makes GPU groups usable from zero: cluster-autoscaler (turns the pods KubeRay's autoscaler
# asks for into nodes, reading the scale-from-zero tags the eks module puts on each group's ASG)
# and the NVIDIA device plugin (advertises nvidia.com/gpu on GPU nodes; without it GPU pods stay
# pending forever). Both charts are pinned.
resource "helm_release" "cluster_autoscaler" {
  name       = "cluster-autoscaler"
  repository = "https://kubernetes.github.io/autoscaler"
  chart      = "cluster-autoscaler"
  version    = var.cluster_autoscaler_chart_version
  namespace  = "kube-system"
  values = [yamlencode({
    cloudProvider = "aws"
    awsRegion     = var.region
    autoDiscovery = { clusterName = var.cluster_name }
    rbac = {
      serviceAccount = {
        name        = "cluster-autoscaler"
        annotations = { "eks.amazonaws.com/role-arn" = var.autoscaler_role_arn }
      }
    }
    extraArgs = {
      "balance-similar-node-groups"   = true
      "expander"                      = "least-waste"
      "scale-down-unneeded-time"      = "10m"
      "skip-nodes-with-local-storage" = false
    }
    nodeSelector = { "sieve/role" = "system" }
  })]
}

resource "helm_release" "nvidia_device_plugin" {
  name             = "nvidia-device-plugin"
  repository       = "https://nvidia.github.io/k8s-device-plugin"
  chart            = "nvidia-device-plugin"
  version          = var.nvidia_device_plugin_chart_version
  namespace        = "nvidia-device-plugin"
  create_namespace = true
  values = [yamlencode({
    nodeSelector = { "sieve/role" = "gpu" }
    tolerations  = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
  })]
}
