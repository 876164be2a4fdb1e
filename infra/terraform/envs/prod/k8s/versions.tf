# Root 2 of 2: everything inside the cluster (namespace, default-deny policy, cluster-autoscaler,
# the NVIDIA device plugin, MLflow, KubeRay and the RayCluster). It reads ../aws's outputs from that
# root's remote state and talks to the EKS API, which is private unless public_api_cidrs was set:
# apply it from inside the VPC (a bastion, SSM session or CI runner there) or over the VPN.
terraform {
  required_version = ">= 1.11.0"
  required_providers {
    kubernetes = { source = "hashicorp/kubernetes", version = "~> 2.35" }
    helm       = { source = "hashicorp/helm", version = "~> 2.17" }
    random     = { source = "hashicorp/random", version = "~> 3.6" }
  }
  backend "s3" {}
}

data "terraform_remote_state" "aws" {
  backend = "s3"
  config = {
    bucket = var.state_bucket
    key    = var.aws_state_key
    region = var.state_region
  }
}

locals {
  aws = data.terraform_remote_state.aws.outputs
  exec_auth = {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", local.aws.cluster_name, "--region", local.aws.region]
  }
}

provider "kubernetes" {
  host                   = local.aws.cluster_endpoint
  cluster_ca_certificate = base64decode(local.aws.cluster_ca)
  exec {
    api_version = local.exec_auth.api_version
    command     = local.exec_auth.command
    args        = local.exec_auth.args
  }
}

provider "helm" {
  kubernetes {
    host                   = local.aws.cluster_endpoint
    cluster_ca_certificate = base64decode(local.aws.cluster_ca)
    exec {
      api_version = local.exec_auth.api_version
      command     = local.exec_auth.command
      args        = local.exec_auth.args
    }
  }
}
